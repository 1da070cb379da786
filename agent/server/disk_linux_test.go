package server

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// TestDiskFlushDropsCachedBlocks: with another image put behind a disk
// (here the loop device's file rewritten under it), the guest reads the
// blocks it cached until Flush drops them, and then the new image's; the
// disk's Capacity is its size; a mounted disk is held.
func TestDiskFlushDropsCachedBlocks(t *testing.T) {
	testenv.RequireRoot(t)
	image := filepath.Join(t.TempDir(), "disk.img")
	old, next := bytes.Repeat([]byte{'a'}, 4096), bytes.Repeat([]byte{'b'}, 4096)
	if err := os.WriteFile(image, old, 0o600); err != nil {
		t.Fatal(err)
	}
	loop, err := mount.SetupLoop(image, mount.LoopParams{Readonly: true, Autoclear: true})
	if err != nil {
		t.Fatalf("set up a loop device: %v", err)
	}
	t.Cleanup(func() { loop.Close() })
	read := func() []byte {
		t.Helper()
		b, err := os.ReadFile(loop.Name())
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if got := read(); !bytes.Equal(got, old) {
		t.Fatalf("read %.8q… from the disk, want the first image", got)
	}
	if err := os.WriteFile(image, next, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := read(); !bytes.Equal(got, old) {
		t.Fatalf("read %.8q… before the flush, want the cached first image (else this test shows nothing)", got)
	}
	d, held, err := openDisk(loop.Name())
	if err != nil || held {
		t.Fatalf("open the disk: held %v, %v", held, err)
	}
	defer d.Close()
	if capacity, err := d.Capacity(); err != nil || capacity != uint64(len(old)) {
		t.Errorf("capacity %d %v, want %d", capacity, err, len(old))
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := read(); !bytes.Equal(got, next) {
		t.Errorf("read %.8q… after the flush, want the image behind the disk now", got)
	}
}

// TestOpenDiskHeld: a disk something claims exclusively, as a mount does,
// is held.
func TestOpenDiskHeld(t *testing.T) {
	testenv.RequireRoot(t)
	image := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(image, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	loop, err := mount.SetupLoop(image, mount.LoopParams{Readonly: true, Autoclear: true})
	if err != nil {
		t.Fatalf("set up a loop device: %v", err)
	}
	t.Cleanup(func() { loop.Close() })
	claim, held, err := openDisk(loop.Name())
	if err != nil || held {
		t.Fatalf("open the disk: held %v, %v", held, err)
	}
	defer claim.Close()
	if d, held, err := openDisk(loop.Name()); err != nil || !held {
		if d != nil {
			d.Close()
		}
		t.Errorf("open a disk claimed exclusively: held %v, %v; want held", held, err)
	}
}
