package launch

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/unixsock"
)

// errServed: a live server of the group listens on the socket already.
var errServed = errors.New("the group's server runs")

// listen creates the shim socket at path (mode 0600 in a 0700 dir, as
// pkg/shim makes it) and returns it for the server. A live server there
// returns errServed; a stale socket left by a crashed server is replaced.
func listen(path string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create shim socket dir: %w", err)
	}
	f, err := unixsock.Listen(path, unix.SOCK_STREAM)
	if !errors.Is(err, unix.EADDRINUSE) {
		return f, err
	}
	if unixsock.Accepts(path, unix.SOCK_STREAM) {
		return nil, errServed
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale shim socket: %w", err)
	}
	return unixsock.Listen(path, unix.SOCK_STREAM)
}

// socketDirLink is the bundle's link to the socket dir, which the task
// server reads for its cleanup: pkg/shim's name for it.
const socketDirLink = "s"

// LinkSocketDir records dir in the bundle (the working dir) for the task
// server, as pkg/shim's `start` does.
func LinkSocketDir(dir string) error {
	if err := os.Remove(socketDirLink); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove socket dir link: %w", err)
	}
	if err := os.Symlink(dir, socketDirLink); err != nil {
		return fmt.Errorf("link socket dir: %w", err)
	}
	return nil
}
