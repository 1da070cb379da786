package container

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/containerd/fifo"
	"golang.org/x/sys/unix"
)

// execFifo is the fifo in runc's state dir of a container on which
// `runc create` leaves the container's init waiting to be started.
const execFifo = "exec.fifo"

// startInit lets the container's init, left by runc create waiting on its
// exec fifo, run the container's process, as `runc start` does (runc 1.x:
// open the fifo, read the byte the init writes until its exec closes the
// fifo, remove it; runc then reports the container running), without a
// runc process of its own: starting one costs a guest 50-90 ms under TCG.
func (c *Container) startInit(ctx context.Context) error {
	path := filepath.Join(c.rt.Root, c.ID, execFifo)
	f, err := openExecFifo(ctx, path, c.init.done)
	if err != nil {
		return err
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) == 0 {
		return errInitEnded
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

var errInitEnded = errors.New("its init ended before it was started")

// openExecFifo opens the fifo at path to read, which blocks until the init
// opens it to write. An init that ended, or ends first, never will: then,
// or when ctx ends, containerd's fifo package releases the open.
func openExecFifo(ctx context.Context, path string, ended <-chan struct{}) (io.ReadCloser, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-ended:
			cancel()
		case <-ctx.Done():
		}
	}()
	f, err := fifo.OpenFifo(ctx, path, unix.O_RDONLY, 0)
	if err != nil {
		select {
		case <-ended:
			return nil, errInitEnded
		default:
			return nil, fmt.Errorf("open exec fifo: %w", err)
		}
	}
	return f, nil
}
