// Package fsmode names the kind of a file for the errors that refuse it
// ("a FIFO, not a network namespace"), from Go's file mode or stat(2)'s.
package fsmode

import (
	"io/fs"

	"golang.org/x/sys/unix"
)

// FromStat is the Go file type of a stat(2) mode.
func FromStat(mode uint32) fs.FileMode {
	return map[uint32]fs.FileMode{
		unix.S_IFDIR: fs.ModeDir, unix.S_IFLNK: fs.ModeSymlink, unix.S_IFIFO: fs.ModeNamedPipe,
		unix.S_IFSOCK: fs.ModeSocket, unix.S_IFCHR: fs.ModeDevice | fs.ModeCharDevice, unix.S_IFBLK: fs.ModeDevice,
	}[mode&unix.S_IFMT]
}

// TypeName says what kind of file m is: "regular file", "directory",
// "FIFO", "character device", ...
func TypeName(m fs.FileMode) string {
	switch t := m.Type(); {
	case t&fs.ModeCharDevice != 0:
		return "character device"
	case t&fs.ModeDevice != 0:
		return "block device"
	case t&fs.ModeNamedPipe != 0:
		return "FIFO"
	case t&fs.ModeSocket != 0:
		return "socket"
	case t&fs.ModeSymlink != 0:
		return "symbolic link"
	case t&fs.ModeDir != 0:
		return "directory"
	case t == 0:
		return "regular file"
	}
	return m.Type().String()
}
