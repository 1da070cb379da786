package testenv

import (
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// WatchOpens returns a function that reports the names of the files in
// dir opened or read since WatchOpens was called (dir itself is not one):
// a test's proof that code never opened a file it must not.
func WatchOpens(t testing.TB, dir string) func() []string {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_OPEN|unix.IN_ACCESS); err != nil {
		t.Fatal(err)
	}
	return func() []string {
		var names []string
		buf := make([]byte, 64<<10)
		n, _ := unix.Read(fd, buf)
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)]), "\x00")
			if name != "" {
				names = append(names, name)
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
		return names
	}
}
