package ocimount

import (
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// TestSystemMknod: a node System makes has exactly the mode asked for,
// whatever the umask.
func TestSystemMknod(t *testing.T) {
	testenv.RequireRoot(t)
	defer unix.Umask(unix.Umask(0o077))
	p := filepath.Join(t.TempDir(), "null")
	dev := unix.Mkdev(1, 3)
	if err := (System{}).Mknod(p, unix.S_IFCHR|0o666, dev); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode != unix.S_IFCHR|0o666 || st.Rdev != dev {
		t.Errorf("node mode %#o dev %d, want %#o %d", st.Mode, st.Rdev, unix.S_IFCHR|0o666, dev)
	}
}
