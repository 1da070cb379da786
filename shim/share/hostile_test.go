package share

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// FUSE opcodes the hostile guest sends (the kernel's ABI).
const (
	opLookup = 1
	opInit   = 26
)

// rawGuest is a guest kernel that says what it likes: the requests a test
// writes, with no kernel's checks between them and the host.
type rawGuest struct {
	reqs    chan []byte
	replies chan []byte
}

func (g *rawGuest) Read(ctx context.Context) ([][]byte, bool, error) {
	select {
	case r := <-g.reqs:
		return [][]byte{r}, false, nil
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
}

func (g *rawGuest) Write(_ context.Context, replies [][]byte) error {
	for _, r := range replies {
		g.replies <- r
	}
	return nil
}

func (g *rawGuest) Close(context.Context) error { return nil }

// ask sends one request and returns its reply's status and body.
func (g *rawGuest) ask(t *testing.T, unique uint64, op uint32, node uint64, body []byte) (int32, []byte) {
	t.Helper()
	h := fuse.InHeader{Opcode: op, Unique: unique, NodeId: node}
	h.Length = uint32(unsafe.Sizeof(h)) + uint32(len(body))
	g.reqs <- append(unsafe.Slice((*byte)(unsafe.Pointer(&h)), unsafe.Sizeof(h)), body...)
	select {
	case r := <-g.replies:
		var out fuse.OutHeader
		if len(r) < int(unsafe.Sizeof(out)) {
			t.Fatalf("reply of %d bytes", len(r))
		}
		out.Status = int32(binary.LittleEndian.Uint32(r[4:]))
		if got := binary.LittleEndian.Uint64(r[8:]); got != unique {
			t.Fatalf("reply to %d, want %d", got, unique)
		}
		return out.Status, r[unsafe.Sizeof(out):]
	case <-time.After(10 * time.Second):
		t.Fatal("no reply")
	}
	return 0, nil
}

// TestShareHostileLookups: a guest that walks through links it finds
// in the directory, as no kernel would (a kernel resolves links itself),
// reaches nothing outside it: the helper's root is the directory.
func TestShareHostileLookups(t *testing.T) {
	testenv.RequireRoot(t)
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o600); err != nil {
		t.Fatal(err)
	}
	host := t.TempDir()
	for name, target := range map[string]string{"abs": outside, "rel": "../" + filepath.Base(outside), "root": "/"} {
		if err := os.Symlink(target, filepath.Join(host, name)); err != nil {
			t.Fatal(err)
		}
	}
	g := &rawGuest{reqs: make(chan []byte, 1), replies: make(chan []byte, 1)}
	ctx := context.Background()
	srv, err := Serve(ctx, g, host, ReadWrite)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close(ctx) })
	init := fuse.InitIn{Major: 7, Minor: 31}
	body := unsafe.Slice((*byte)(unsafe.Pointer(&init.Major)), unsafe.Sizeof(init)-unsafe.Sizeof(init.InHeader))
	if st, _ := g.ask(t, 1, opInit, 0, body); st != 0 {
		t.Fatalf("INIT: status %d", st)
	}
	unique := uint64(2)
	lookup := func(node uint64, name string) (int32, uint64) {
		unique++
		st, out := g.ask(t, unique, opLookup, node, append([]byte(name), 0))
		if st != 0 {
			return st, 0
		}
		return st, binary.LittleEndian.Uint64(out)
	}
	for _, link := range []string{"abs", "rel", "root"} {
		st, node := lookup(fuse.FUSE_ROOT_ID, link)
		if st != 0 {
			t.Fatalf("lookup %s: status %d", link, st)
		}
		if st, _ := lookup(node, "secret"); st == 0 {
			t.Errorf("lookup secret under link %s: found, want it out of reach", link)
		}
		for _, name := range []string{"..", "../secret", filepath.Join(outside, "secret")} {
			if st, _ := lookup(node, name); st == 0 && name != ".." {
				t.Errorf("lookup %q under link %s: found", name, link)
			}
		}
	}
	if st, _ := lookup(fuse.FUSE_ROOT_ID, filepath.Join("..", filepath.Base(outside), "secret")); st == 0 {
		t.Error("lookup ../OUTSIDE/secret from the root: found")
	}
	if st, _ := lookup(12345, "x"); st == 0 {
		t.Error("lookup under a node never given: found")
	}
	if st, _ := lookup(fuse.FUSE_ROOT_ID, "abs"); st == -int32(syscall.ENOENT) {
		t.Error("the share died on the hostile requests")
	}
}
