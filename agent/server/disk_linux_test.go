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
// blocks it cached until flush drops them, and then the new image's.
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
	if err := (LinuxMounts{}).flush(loop.Name()); err != nil {
		t.Fatal(err)
	}
	if got := read(); !bytes.Equal(got, next) {
		t.Errorf("read %.8q… after the flush, want the image behind the disk now", got)
	}
}
