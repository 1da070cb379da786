package snapshotter

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/containerd/containerd/v2/core/snapshots"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// importFork commits as layer "fork", on top of layer parent, a diff of the
// link in parentDir (memory parentMem) that changes pages, and returns the
// link dir and the new memory.
func importFork(t *testing.T, sn snapshots.Snapshotter, root, parentDir, parentMem, parent string, pages []int) (string, string) {
	t.Helper()
	ctx := context.Background()
	mem, err := os.ReadFile(parentMem)
	if err != nil {
		t.Fatal(err)
	}
	var dirty []chain.Extent
	for _, p := range pages {
		mem[p*page+1] ^= 0x5a
		dirty = append(dirty, chain.Extent{Offset: int64(p) * page, Length: page})
	}
	memPath, dir := filepath.Join(root, "forkmem"), filepath.Join(root, "fork")
	if err := os.WriteFile(memPath, mem, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "qemu.state"), []byte("fork state"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := chain.WriteDiffPages(ctx, memPath, dirty, parentDir, testMeta(), dir); err != nil {
		t.Fatal(err)
	}
	ms, err := sn.Prepare(ctx, "extract-fork", parent, snapshots.WithLabels(map[string]string{snapshots.LabelSnapshotRef: "fork"}))
	if err != nil {
		t.Fatal(err)
	}
	copyDir(t, dir, mountDir(t, ms))
	if err := sn.Commit(ctx, "fork", "extract-fork"); err != nil {
		t.Fatal(err)
	}
	return dir, memPath
}

// A fork of a chain whose flat file the node has stages that file (same
// inode) and the fork's memory files as deltas: nothing is flattened again,
// and the file + the deltas' pages are the fork's memory.
func TestForkStagesDelta(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	fx := makeChain(t, filepath.Join(root, "chain"), 4, 64, 2)
	var flattens atomic.Int64
	sn := newSnapshotter(t, filepath.Join(root, "sn"), countFlattens(&flattens))
	top := importChain(t, sn, fx, "layer")
	base, err := sn.Prepare(ctx, "base", top)
	if err != nil {
		t.Fatal(err)
	}
	forkDir, forkMem := importFork(t, sn, root, fx.dirs[1], fx.mem, top, []int{1, 2, 30})
	ms, err := sn.Prepare(ctx, "forked", "fork")
	if err != nil {
		t.Fatal(err)
	}
	st, err := chain.OpenStaged(mountDir(t, ms))
	if err != nil {
		t.Fatal(err)
	}
	if flattens.Load() != 1 {
		t.Errorf("%d flattens, want the base chain's only", flattens.Load())
	}
	if st.Memory.Covers != 2 || len(st.Pending()) != 1 || !strings.Contains(st.Memory.Reason, "links 1-2 are flattened on this node") {
		t.Fatalf("staged memory %+v, want the 2-link prefix and the fork pending, saying so", st.Memory)
	}
	if a, b := stat(t, st.MemoryPath()), stat(t, filepath.Join(mountDir(t, base), chain.StagedMemory)); a.Ino != b.Ino {
		t.Errorf("the fork's staged memory is inode %d, the base's %d: want the same flat file", a.Ino, b.Ino)
	}
	ext, data := st.DeltaPaths(2)
	if a, b := stat(t, data), stat(t, filepath.Join(forkDir, chain.DataFile)); a.Size != b.Size {
		t.Errorf("staged delta data is %d bytes, the fork link's %d", a.Size, b.Size)
	}
	mem, err := os.ReadFile(st.MemoryPath())
	if err != nil {
		t.Fatal(err)
	}
	err = chain.ReadPages(ctx, ext, data, st.Top(), func(off int64, b []byte) error {
		copy(mem[off:], b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(forkMem)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mem, want) {
		t.Fatal("staged memory + the staged delta is not the fork's memory")
	}
	if state, err := os.ReadFile(st.StatePath("qemu.state")); err != nil || string(state) != "fork state" {
		t.Errorf("staged state %q, %v; want the fork's", state, err)
	}
	for _, key := range []string{"forked", "base"} {
		if err := sn.Remove(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
}
