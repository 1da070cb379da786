package vm

import (
	"os"
	"path/filepath"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// stagedSnapshot makes a snapshot dir as the cocoon snapshotter stages one
// (rootfs.img and rootfs.json beside fs/ and work/) and mounts its overlay
// at a new dir, as containerd's CRI mounts an image volume; it returns the
// mount point and the snapshot dir.
func stagedSnapshot(t *testing.T) (string, string) {
	t.Helper()
	testenv.RequireRoot(t)
	base := t.TempDir()
	snap := filepath.Join(base, "snapshot")
	lower, target := filepath.Join(base, "lower"), filepath.Join(base, "target")
	for _, d := range []string{filepath.Join(snap, "fs"), filepath.Join(snap, "work"), lower, target} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(snap, chain.StagedRootfsImage), make([]byte, 4096), 0o444); err != nil {
		t.Fatal(err)
	}
	if err := chain.WriteStagedRootfs(snap, chain.StagedRootfs{FSType: chain.RootfsErofs, Size: 4096, Key: "k", Layers: 1}); err != nil {
		t.Fatal(err)
	}
	opts := "lowerdir=" + lower + ",upperdir=" + filepath.Join(snap, "fs") + ",workdir=" + filepath.Join(snap, "work")
	if err := unix.Mount("overlay", target, "overlay", 0, opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(target, unix.MNT_DETACH) })
	return target, snap
}

// TestImageVolume: in a pod's VM, a bind of a snapshot the cocoon
// snapshotter staged goes to the guest as its image on a disk, bound from
// where the guest mounts it; a plain directory is still copied.
func TestImageVolume(t *testing.T) {
	target, snap := stagedSnapshot(t)
	img, ok := (&binds{budget: testCopies()}).stagedImage(target)
	if !ok || img.Dir != snap {
		t.Fatalf("stagedImage(%s) = %+v, %v; want the image staged in %s", target, img, ok, snap)
	}
	if _, ok := (&binds{budget: testCopies()}).stagedImage(t.TempDir()); ok {
		t.Fatal("a plain directory was taken for an image volume")
	}
	b := &binds{dir: bindSources + "/c", pod: newSharedDirs(podBindSources, nil), budget: testCopies()}
	got, err := b.translate(specs.Mount{Destination: "/mnt/image", Type: "bind", Source: target, Options: []string{"rbind", "ro"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || len(b.images) != 1 || got[0].Source != b.images[0].path || len(b.files) != 0 {
		t.Fatalf("mounts %+v, images %+v, files %d: want one bind of the image's guest mount and nothing copied", got, b.images, len(b.files))
	}
	if b.images[0].image.ImagePath() != filepath.Join(snap, chain.StagedRootfsImage) {
		t.Fatalf("the volume's disk is %s, want the staged image", b.images[0].image.ImagePath())
	}
}
