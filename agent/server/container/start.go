package container

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

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
		return errors.New("its init ended before it was started")
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

// openExecFifo opens the fifo at path to read, which blocks until the init
// opens it to write. An init that ended, or ends first, never will: then,
// or when ctx ends, a writer of the agent's own releases the open.
func openExecFifo(ctx context.Context, path string, ended <-chan struct{}) (*os.File, error) {
	type result struct {
		f   *os.File
		err error
	}
	opened := make(chan result, 1)
	go func() {
		f, err := os.OpenFile(path, os.O_RDONLY|unix.O_CLOEXEC, 0)
		opened <- result{f, err}
	}()
	var why error
	select {
	case r := <-opened:
		if r.err != nil {
			return nil, fmt.Errorf("open exec fifo: %w", r.err)
		}
		return r.f, nil
	case <-ended:
		why = errors.New("its init ended before it was started")
	case <-ctx.Done():
		why = ctx.Err()
	}
	for {
		// Fails (ENXIO) until the reader's open has begun.
		if w, err := os.OpenFile(path, os.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0); err == nil {
			w.Close()
		}
		select {
		case r := <-opened:
			if r.f != nil {
				r.f.Close()
			}
			return nil, why
		case <-time.After(10 * time.Millisecond):
		}
	}
}
