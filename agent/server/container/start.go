package container

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"

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
func (c *Container) startInit(ctx context.Context, path string) error {
	data, err := readExecFifo(ctx, path, c.init.done)
	if err != nil {
		return err
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

// readExecFifo reads the exec fifo at path: its open blocks until the init
// opens it to write, and the read ends once the init's exec closes it. An
// init that ends before it took its start never opens it: then a writer
// of the agent's own, which writes nothing, releases the reader. So what
// was read says whether the init took its start, not which of the start
// and the init's end came first (a quick process ends right after it).
// When ctx ends, containerd's fifo package releases the open.
func readExecFifo(ctx context.Context, path string, ended <-chan struct{}) ([]byte, error) {
	read := make(chan struct{})
	defer close(read)
	go releaseOnEnd(path, ended, read)
	f, err := fifo.OpenFifo(ctx, path, unix.O_RDONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("open exec fifo: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return data, nil
}

// releaseOnEnd, once the init has ended, opens the fifo at path to write
// and closes it, until the reader is done.
func releaseOnEnd(path string, ended, read <-chan struct{}) {
	select {
	case <-ended:
	case <-read:
		return
	}
	for {
		// ENXIO until the reader's open has begun.
		if w, err := os.OpenFile(path, os.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0); err == nil {
			w.Close()
		}
		select {
		case <-read:
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}
