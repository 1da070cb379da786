package firecracker

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

func TestCopyMemoryKeepsHoles(t *testing.T) {
	t.Run("same filesystem", func(t *testing.T) { testCopyMemory(t, t.TempDir()) })
	t.Run("to tmpfs", func(t *testing.T) {
		shm, err := os.MkdirTemp("/dev/shm", "cocoon-test-")
		if err != nil {
			testenv.Unavailable(t, "a writable /dev/shm (tmpfs) for a cross-filesystem copy")
		}
		t.Cleanup(func() { os.RemoveAll(shm) })
		testCopyMemory(t, shm)
	})
}

// testCopyMemory copies a sparse file from a temp dir into dstDir.
func testCopyMemory(t *testing.T, dstDir string) {
	src, dst := filepath.Join(t.TempDir(), "src"), filepath.Join(dstDir, "dst")
	const size = 64 << 20
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte{0xAB}, 8192)
	for _, off := range []int64{0, 20 << 20, size - 8192} {
		if _, err := f.WriteAt(data, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := copyMemory(src, dst); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(src)
	got, err := os.ReadFile(dst)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("copy differs from source (err %v)", err)
	}
	st, err := os.Stat(dst)
	if err != nil {
		t.Fatal(err)
	}
	if blocks := st.Sys().(*syscall.Stat_t).Blocks * 512; blocks > 1<<20 {
		t.Errorf("copy allocates %d bytes of a %d-byte file with 24 KiB of data: holes were filled", blocks, size)
	}
	if err := copyMemory(src, dst); err == nil {
		t.Error("copy over an existing file: want an error")
	}
}
