// Package unixsock makes and probes unix sockets with raw system calls,
// for the shim's launcher, whose start-up the net package would slow.
package unixsock

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Listen binds a unix socket of type typ (unix.SOCK_STREAM or
// unix.SOCK_SEQPACKET) at path with mode 0600 and listens on it. The
// descriptor is close-on-exec; hand it to a child as one of its files.
func Listen(path string, typ int) (*os.File, error) {
	fd, err := unix.Socket(unix.AF_UNIX, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("create socket %s: %w", path, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind %s: %w", path, err)
	}
	err = unix.Chmod(path, 0o600)
	if err == nil {
		err = unix.Listen(fd, unix.SOMAXCONN)
	}
	if err != nil {
		unix.Close(fd)
		return nil, errors.Join(fmt.Errorf("listen on %s: %w", path, err), os.Remove(path))
	}
	return os.NewFile(uintptr(fd), path), nil
}

// Accepts reports whether something listens on the unix socket of type typ
// at path. The probe does not block: a full backlog means a listener that
// is there.
func Accepts(path string, typ int) bool {
	fd, err := unix.Socket(unix.AF_UNIX, typ|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	err = unix.Connect(fd, &unix.SockaddrUnix{Name: path})
	return err == nil || errors.Is(err, unix.EAGAIN)
}
