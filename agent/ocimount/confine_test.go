package ocimount

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestConfine: masked paths go under a read-only tmpfs (a directory) or
// /dev/null (a file), read-only paths under a read-only bind of
// themselves, then the root is made read-only; a path the image lacks is
// skipped, and a path leading out of the root stays in it.
func TestConfine(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"proc/acpi", "proc/sys"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "proc/kcore"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc", filepath.Join(root, "escape")); err != nil {
		t.Fatal(err)
	}
	mnt := &fakeMounter{}
	s := NewStack(mnt)
	masked := []string{"/proc/acpi", "/proc/kcore", "/proc/none"}
	if err := s.Confine(root, masked, []string{"/proc/sys", "/escape/passwd"}, true); err != nil {
		t.Fatal(err)
	}
	ro := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY)
	want := []string{
		fmt.Sprintf("mount tmpfs %s/proc/acpi tmpfs %#x ", root, unix.MS_RDONLY),
		fmt.Sprintf("mount /dev/null %s/proc/kcore  %#x ", root, unix.MS_BIND),
		fmt.Sprintf("mount %s/proc/sys %s/proc/sys  %#x ", root, root, unix.MS_BIND|unix.MS_REC),
		fmt.Sprintf("mount  %s/proc/sys  %#x ", root, ro|unix.MS_REC),
		fmt.Sprintf("mount  %s  %#x ", root, ro),
	}
	if got := mnt.did; strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("mounts:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
