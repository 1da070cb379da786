package fsmode

import (
	"io/fs"
	"testing"

	"golang.org/x/sys/unix"
)

// TestTypeName: every kind of file is named, from Go's mode and stat's.
func TestTypeName(t *testing.T) {
	for _, tc := range []struct {
		stat uint32
		mode fs.FileMode
		want string
	}{
		{unix.S_IFREG | 0o644, 0o644, "regular file"},
		{unix.S_IFDIR, fs.ModeDir, "directory"},
		{unix.S_IFLNK, fs.ModeSymlink, "symbolic link"},
		{unix.S_IFIFO, fs.ModeNamedPipe, "FIFO"},
		{unix.S_IFSOCK, fs.ModeSocket, "socket"},
		{unix.S_IFCHR, fs.ModeDevice | fs.ModeCharDevice, "character device"},
		{unix.S_IFBLK, fs.ModeDevice, "block device"},
	} {
		if got := TypeName(tc.mode); got != tc.want {
			t.Errorf("TypeName(%v) = %q, want %q", tc.mode, got, tc.want)
		}
		if got := TypeName(FromStat(tc.stat)); got != tc.want {
			t.Errorf("TypeName(FromStat(%#o)) = %q, want %q", tc.stat, got, tc.want)
		}
	}
}
