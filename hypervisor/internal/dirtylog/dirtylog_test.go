package dirtylog

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

const (
	page  = 4096
	pages = 16
)

// sparse writes a memory file of pages pages holding data at the given
// pages (filled with their byte) and holes elsewhere.
func sparse(t *testing.T, path string, data map[int]byte) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(pages * page); err != nil {
		t.Fatal(err)
	}
	for p, b := range data {
		if _, err := f.WriteAt(bytes.Repeat([]byte{b}, page), int64(p)*page); err != nil {
			t.Fatal(err)
		}
	}
}

// Two diff snapshots merged make one link of both's pages, the later
// bytes winning, even a page dirtied back to zeros; its chain flattens to
// the memory after both.
func TestLogMergesDiffs(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	base := filepath.Join(dir, "base")
	sparse(t, base, map[int]byte{0: 1, 1: 1, 2: 1, 5: 1})
	parentDir := filepath.Join(dir, "parent")
	meta := chain.Meta{Hypervisor: "firecracker", GuestOS: "linux", VCPUs: 1}
	if _, err := chain.WriteFull(ctx, base, meta, parentDir); err != nil {
		t.Fatal(err)
	}
	parent, err := chain.ReadLink(parentDir)
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(filepath.Join(dir, "log"), pages*page, page)
	if err != nil {
		t.Fatal(err)
	}
	d1, d2 := filepath.Join(dir, "d1"), filepath.Join(dir, "d2")
	sparse(t, d1, map[int]byte{1: 7, 9: 7})
	sparse(t, d2, map[int]byte{9: 8, 2: 0}) // page 2 dirtied to zeros
	for _, d := range []string{d1, d2} {
		if err := l.Merge(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	linkDir := filepath.Join(dir, "link")
	link, err := l.WriteLink(ctx, parent, meta, linkDir)
	if err != nil {
		t.Fatal(err)
	}
	if link.Memory.DataBytes != 3*page {
		t.Errorf("link carries %d bytes, want pages 1, 2 and 9", link.Memory.DataBytes)
	}
	flat := filepath.Join(dir, "flat")
	if err := chain.Flatten(ctx, []string{parentDir, linkDir}, flat); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(flat)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, pages*page)
	for p, b := range map[int]byte{0: 1, 1: 7, 5: 1, 9: 8} {
		copy(want[p*page:], bytes.Repeat([]byte{b}, page))
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the chain does not flatten to the memory after both diffs")
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "log")); !os.IsNotExist(err) {
		t.Errorf("log file left: %v", err)
	}
}

// A full baseline is merged as the pages that differ from the restored
// memory; a diff of the wrong size is refused.
func TestLogMergeChanged(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	restored, full := filepath.Join(dir, "restored"), filepath.Join(dir, "full")
	sparse(t, restored, map[int]byte{0: 1, 3: 1})
	sparse(t, full, map[int]byte{0: 1, 3: 2, 4: 2})
	l, err := New(filepath.Join(dir, "log"), pages*page, page)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.MergeChanged(ctx, full, restored); err != nil {
		t.Fatal(err)
	}
	if len(l.pages) != 2 || l.pages[0].Offset != 3*page || l.pages[1].Offset != 4*page {
		t.Errorf("changed pages %v, want 3 and 4", l.pages)
	}
	small := filepath.Join(dir, "small")
	if err := os.WriteFile(small, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := l.Merge(ctx, small); err == nil {
		t.Error("a diff of the wrong size was merged")
	}
}
