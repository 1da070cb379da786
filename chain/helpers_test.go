package chain

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

const testPage = 4096

func testMeta(state ...string) Meta {
	return Meta{Hypervisor: "qemu", HypervisorBuild: "QEMU emulator version 7.2.0", GuestOS: "linux", VCPUs: 2, StateFiles: state}
}

// randomMemory returns pages bytes of memory where about half the pages are
// non-zero (and a non-zero page may still start with zero bytes).
func randomMemory(seed uint64, pages int) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	mem := make([]byte, pages*testPage)
	for p := 0; p < pages; p++ {
		if r.IntN(2) == 0 {
			continue
		}
		page := mem[p*testPage : (p+1)*testPage]
		for i := r.IntN(testPage); i < testPage; i += 1 + r.IntN(64) {
			page[i] = byte(r.Uint32()) | 1
		}
	}
	return mem
}

// writeSparse writes mem to path, leaving zero pages as holes.
func writeSparse(t testing.TB, path string, mem []byte) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(int64(len(mem))); err != nil {
		t.Fatal(err)
	}
	for off := 0; off < len(mem); off += testPage {
		if p := mem[off : off+testPage]; !isZero(p) {
			if _, err := f.WriteAt(p, int64(off)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// writeState puts a state file into a new link dir.
func writeState(t testing.TB, dir, name string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), []byte("device state"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// testChain is a 3-link chain with the memory after each link.
type testChain struct {
	dirs []string
	mems [][]byte
}

// buildChain writes full + diff (by comparison, with pages set to zero) +
// diff (by dirty list) under root.
func buildChain(t testing.TB, root string, pages int) testChain {
	t.Helper()
	ctx := context.Background()
	var c testChain
	mem0 := randomMemory(1, pages)
	c.add(t, root, mem0, func(memPath, dir string) (*Link, error) {
		return WriteFull(ctx, memPath, testMeta("qemu.state"), dir)
	})
	mem1 := bytes.Clone(mem0)
	for p := 0; p < pages; p += 7 {
		clear(mem1[p*testPage : (p+1)*testPage]) // some were non-zero: diff must carry zero pages
	}
	for p := 3; p < pages; p += 11 {
		mem1[p*testPage+100] ^= 0x5a
	}
	parentMem := filepath.Join(root, "mem0")
	c.add(t, root, mem1, func(memPath, dir string) (*Link, error) {
		return WriteDiff(ctx, memPath, parentMem, c.dirs[0], testMeta("qemu.state"), dir)
	})
	mem2 := bytes.Clone(mem1)
	var dirty []Extent
	for p := 5; p < pages; p += 13 {
		mem2[p*testPage+7] ^= 0xff
		clear(mem2[(p+1)*testPage : (p+2)*testPage])
		dirty = append(dirty, Extent{int64(p) * testPage, 2 * testPage})
	}
	c.add(t, root, mem2, func(memPath, dir string) (*Link, error) {
		return WriteDiffPages(ctx, memPath, dirty, c.dirs[1], testMeta("qemu.state"), dir)
	})
	return c
}

func (c *testChain) add(t testing.TB, root string, mem []byte, write func(memPath, dir string) (*Link, error)) {
	t.Helper()
	n := len(c.dirs)
	memPath := filepath.Join(root, "mem"+string(rune('0'+n)))
	writeSparse(t, memPath, mem)
	dir := filepath.Join(root, "link"+string(rune('0'+n)))
	writeState(t, dir, "qemu.state")
	if _, err := write(memPath, dir); err != nil {
		t.Fatalf("write link %d: %v", n, err)
	}
	c.dirs = append(c.dirs, dir)
	c.mems = append(c.mems, mem)
}

// checkSparse fails unless every zero page of mem is a hole in path.
func checkSparse(t *testing.T, path string, mem []byte) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	holes := 0
	for off := 0; off < len(mem); off += testPage {
		if !isZero(mem[off : off+testPage]) {
			continue
		}
		d, err := unix.Seek(int(f.Fd()), int64(off), unix.SEEK_DATA)
		if err == nil && d == int64(off) {
			t.Fatalf("%s: zero page at %d is allocated, want a hole", path, off)
		}
		holes++
	}
	if holes == 0 {
		t.Fatalf("test memory has no zero pages")
	}
}
