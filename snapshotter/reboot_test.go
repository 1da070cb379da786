package snapshotter

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/containerd/v2/core/snapshots"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// TestRestageAfterReboot loses what a host crash can lose of a staged dir
// and of the flat file it links (neither is fsynced) and restarts: within
// one boot the dir is left alone, after a new boot the flat file is built
// anew and the dir staged again from it.
func TestRestageAfterReboot(t *testing.T) {
	ctx := context.Background()
	fx := makeChain(t, t.TempDir(), 95, 32, 2)
	root := t.TempDir()
	removableAfter(t, root)
	boot := "boot-1"
	open := func() *Snapshotter {
		t.Helper()
		sn, err := New(context.Background(), root, withBootID(func() (string, error) { return boot, nil }))
		if err != nil {
			t.Fatal(err)
		}
		return sn
	}
	sn := open()
	top := importChain(t, sn, fx, "layer")
	ms, err := sn.Prepare(ctx, "ctr", top)
	if err != nil {
		t.Fatal(err)
	}
	dir := mountDir(t, ms)
	unpack, err := sn.Prepare(ctx, "extract-next", top, snapshots.WithLabels(map[string]string{snapshots.LabelSnapshotRef: "next"}))
	if err != nil {
		t.Fatal(err)
	}
	unpacked := filepath.Join(mountDir(t, unpack), "half-unpacked")
	if err := os.WriteFile(unpacked, []byte("layer bytes"), 0o644); err != nil {
		t.Fatal(err)
	}
	sn.Close()
	lose := func() {
		t.Helper()
		for _, err := range []error{
			os.Truncate(filepath.Join(dir, chain.StagedChain), 0),
			os.Truncate(filepath.Join(dir, "qemu.state"), 0),
			os.Truncate(flatPath(t, root, fx.dirs[1]), 4096),
			os.Remove(filepath.Join(dir, chain.StagedMemory)),
		} {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	lose()

	sn = open()
	if _, err := chain.OpenStaged(dir); err == nil {
		t.Error("a restart within one boot re-staged a dir a running VM may use")
	}
	sn.Close()

	boot = "boot-2"
	sn = open()
	t.Cleanup(func() { sn.Close() })
	st, err := chain.OpenStaged(dir)
	if err != nil {
		t.Fatalf("staged dir after a reboot: %v", err)
	}
	if mem, flat := stat(t, st.MemoryPath()), stat(t, flatPath(t, root, fx.dirs[1])); mem.Ino != flat.Ino {
		t.Errorf("re-staged memory is inode %d, want the flat file's %d", mem.Ino, flat.Ino)
	}
	sameContent(t, st.MemoryPath(), fx.mem)
	sameContent(t, st.StatePath("qemu.state"), filepath.Join(fx.dirs[1], "qemu.state"))
	if b, err := os.ReadFile(unpacked); err != nil || string(b) != "layer bytes" {
		t.Errorf("an unpack in progress was touched by the re-staging: %q, %v", b, err)
	}
	if _, err := sn.Prepare(ctx, "ctr-2", top); err != nil {
		t.Errorf("prepare after re-staging: %v", err)
	}
}
