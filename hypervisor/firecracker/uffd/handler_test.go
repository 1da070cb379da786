package uffd

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/firecracker/uffd/uffdpeer"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// hangGuard bounds how long a test waits on the handler, so a handler that
// never resolves a fault fails the test instead of hanging it.
const hangGuard = 30 * time.Second

var pageSize = os.Getpagesize()

// memoryFile writes a memory file of pages random pages to dir, punches the
// given page ranges into holes and returns its path and expected content.
func memoryFile(t testing.TB, dir string, pages int, holes [][2]int) (string, []byte) {
	t.Helper()
	want := make([]byte, pages*pageSize)
	rnd := rand.New(rand.NewPCG(1, 2))
	for i := range want {
		want[i] = byte(rnd.Uint32())
	}
	path := filepath.Join(dir, "memory")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(want); err != nil {
		t.Fatal(err)
	}
	for _, h := range holes {
		off, n := h[0]*pageSize, (h[1]-h[0])*pageSize
		if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, int64(off), int64(n)); err != nil {
			t.Fatalf("punch hole: %v", err)
		}
		clear(want[off : off+n])
	}
	return path, want
}

// startHandler listens on a socket in dir for path; Close runs at cleanup.
func startHandler(t testing.TB, dir, path string) (*Handler, string) {
	t.Helper()
	sock := filepath.Join(dir, "uffd.sock")
	h, err := Listen(context.Background(), sock, path)
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return h, sock
}

func startPeer(t testing.TB, size int, features uint64) *uffdpeer.Peer {
	t.Helper()
	p, err := uffdpeer.New(size, features)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// onThread runs fn on a goroutine locked to its own OS thread, as a vCPU
// thread is, and fails t if fn errs or does not return within hangGuard.
func onThread(t *testing.T, fn func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		done <- fn()
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(hangGuard):
		t.Fatalf("guest memory access not served within %v", hangGuard)
	}
}

// checkPages reads each listed guest page (backed by file page fileOf(g))
// and compares it with want.
func checkPages(p *uffdpeer.Peer, guestPages []int, fileOf func(int) int, want []byte) error {
	buf := make([]byte, pageSize)
	for _, g := range guestPages {
		if err := p.Read(g*pageSize, buf); err != nil {
			return err
		}
		f := fileOf(g) * pageSize
		if !bytes.Equal(buf, want[f:f+pageSize]) {
			return fmt.Errorf("guest page %d differs from file page %d", g, fileOf(g))
		}
	}
	return nil
}

func isZero(b []byte) bool { return bytes.Count(b, []byte{0}) == len(b) }

// TestHandlerServesFaults: 1000 pages of two regions (whose file offsets
// are swapped) touched in random order equal the file, holes included;
// a removed range reads back as zeros; pages outside it keep their bytes
// without faulting again; Close ends the handler cleanly.
func TestHandlerServesFaults(t *testing.T) {
	testenv.RequireRoot(t)
	const pages, touches = 2048, 1000
	half := pages / 2
	dir := t.TempDir()
	path, want := memoryFile(t, dir, pages, [][2]int{{100, 164}, {1000, 1010}, {2040, 2048}})
	h, sock := startHandler(t, dir, path)
	p := startPeer(t, pages*pageSize, uffdpeer.FeatureEventRemove)
	size := uint64(half * pageSize)
	if err := p.Send(sock, p.Mapping(size, size, 0), p.Mapping(0, size, size)); err != nil {
		t.Fatal(err)
	}
	fileOf := func(g int) int { return (g + half) % pages }

	touched := rand.Perm(pages)[:touches]
	onThread(t, func() error { return checkPages(p, touched, fileOf, want) })

	// Balloon: give back 64 pages, then touch them all again.
	const removeAt, removed = 200, 64
	if err := p.Remove(removeAt*pageSize, removed*pageSize); err != nil {
		t.Fatal(err)
	}
	zeros := make([]byte, pages*pageSize)
	var again []int
	for g := removeAt; g < removeAt+removed; g++ {
		again = append(again, g)
	}
	onThread(t, func() error { return checkPages(p, again, func(g int) int { return g }, zeros) })

	// Pages outside the removed range keep their content and fault no more.
	var kept []int
	for _, g := range touched {
		if g < removeAt || g >= removeAt+removed {
			kept = append(kept, g)
		}
	}
	onThread(t, func() error { return checkPages(p, kept, fileOf, want) })

	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if err := h.Wait(); err != nil {
		t.Fatalf("Wait after Close: %v", err)
	}
	// Read the counters only now: a fault's reader wakes up before the
	// handler has counted it.
	var holePages uint64
	for _, g := range touched {
		if isZero(want[fileOf(g)*pageSize : (fileOf(g)+1)*pageSize]) {
			holePages++
		}
	}
	got := h.Stats()
	if want := (Stats{Faults: touches + removed, Copied: touches - holePages, Zeroed: holePages + removed, Removes: 1}); got != want {
		t.Errorf("stats %+v, want %+v", got, want)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket %s still there after Close: %v", sock, err)
	}
}

// A guest's first access to a page may be a write: the page is filled from
// the file first, and the write lands on top of it.
func TestHandlerWriteFault(t *testing.T) {
	testenv.RequireRoot(t)
	const pages = 8
	dir := t.TempDir()
	path, want := memoryFile(t, dir, pages, [][2]int{{4, 8}})
	h, sock := startHandler(t, dir, path)
	p := startPeer(t, pages*pageSize, uffdpeer.FeatureEventRemove)
	if err := p.Send(sock, p.Mapping(0, uint64(pages*pageSize), 0)); err != nil {
		t.Fatal(err)
	}
	data := []byte("written by the guest")
	for _, g := range []int{1, 5} { // file data, hole
		off := g*pageSize + 100
		copy(want[off:], data)
		onThread(t, func() error { return p.Write(off, data) })
	}
	onThread(t, func() error { return checkPages(p, []int{1, 5}, func(g int) int { return g }, want) })
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if got, want := h.Stats(), (Stats{Faults: 2, Copied: 1, Zeroed: 1}); got != want {
		t.Errorf("stats %+v, want %+v", got, want)
	}
}

// Faults racing with balloon removes: UFFDIO_COPY meets EAGAIN while a
// remove is in flight and must retry. Every page read is the file's bytes
// or zeros, and the handler neither fails nor hangs.
func TestHandlerFaultsRaceRemoves(t *testing.T) {
	testenv.RequireRoot(t)
	const pages, removes = 1024, 2000
	dir := t.TempDir()
	path, want := memoryFile(t, dir, pages, nil)
	h, sock := startHandler(t, dir, path)
	p := startPeer(t, pages*pageSize, uffdpeer.FeatureEventRemove)
	if err := p.Send(sock, p.Mapping(0, uint64(pages*pageSize), 0)); err != nil {
		t.Fatal(err)
	}

	stop := make(chan struct{})
	removeErr := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		defer close(stop)
		rnd := rand.New(rand.NewPCG(3, 4))
		for range removes {
			g, n := rnd.IntN(pages-16), 1+rnd.IntN(16)
			if err := p.Remove(g*pageSize, n*pageSize); err != nil {
				removeErr <- err
				return
			}
		}
		removeErr <- nil
	}()
	onThread(t, func() error {
		buf := make([]byte, pageSize)
		for {
			select {
			case <-stop:
				return nil
			default:
			}
			g := rand.IntN(pages)
			if err := p.Read(g*pageSize, buf); err != nil {
				return err
			}
			if !isZero(buf) && !bytes.Equal(buf, want[g*pageSize:(g+1)*pageSize]) {
				return fmt.Errorf("guest page %d is neither the file's page nor zeros", g)
			}
		}
	})
	if err := <-removeErr; err != nil {
		t.Fatal(err)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if err := h.Wait(); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	st := h.Stats()
	if st.Removes != removes {
		t.Errorf("%d removes seen, want %d", st.Removes, removes)
	}
	t.Logf("stats %+v", st)
}
