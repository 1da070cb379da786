package shares

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// queued bounds the kernel's requests read and not yet pulled by the
// host: past it the reader waits, and the kernel queues them itself.
const queued = 64

// share is one mounted share: a reader takes the kernel's requests off
// /dev/fuse into reqs until the file system goes or close stops it.
type share struct {
	path string
	dev  int // /dev/fuse, non-blocking
	wake int // eventfd that stops the reader's poll

	reqs    chan []byte
	stopped chan struct{} // closed by close
	done    chan struct{} // closed when the reader ended

	rmu     sync.Mutex // one read at a time
	pending []byte     // a request the last read had no room for

	once sync.Once
}

func newShare(path string, dev int) (*share, error) {
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	sh := &share{path: path, dev: dev, wake: wake, reqs: make(chan []byte, queued),
		stopped: make(chan struct{}), done: make(chan struct{})}
	go sh.readLoop()
	return sh, nil
}

// readLoop reads the kernel's requests until the file system is unmounted
// (ENODEV) or close wakes it.
func (sh *share) readLoop() {
	defer close(sh.done)
	buf := make([]byte, api.MaxShareMsg)
	fds := []unix.PollFd{{Fd: int32(sh.dev), Events: unix.POLLIN}, {Fd: int32(sh.wake), Events: unix.POLLIN}}
	for {
		if _, err := unix.Poll(fds, -1); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return
		}
		if fds[1].Revents != 0 || fds[0].Revents&unix.POLLIN == 0 {
			return
		}
		n, err := unix.Read(sh.dev, buf)
		switch {
		case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR), errors.Is(err, unix.ENOENT):
			continue // another's, interrupted, or withdrawn
		case err != nil:
			return
		}
		select {
		case sh.reqs <- append([]byte(nil), buf[:n]...):
		case <-sh.stopped:
			return
		}
	}
}

// read returns the requests the kernel made: at least one, waiting for
// it, and those made meanwhile up to api.MaxShareBatch bytes; eof once
// the reader ended and nothing is left.
func (sh *share) read(ctx context.Context) (reqs [][]byte, eof bool, _ error) {
	sh.rmu.Lock()
	defer sh.rmu.Unlock()
	first := sh.pending
	sh.pending = nil
	if first == nil {
		select {
		case first = <-sh.reqs:
		case <-sh.done:
			select {
			case first = <-sh.reqs:
			default:
				return nil, true, nil
			}
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
	reqs, total := [][]byte{first}, len(first)
	for {
		select {
		case r := <-sh.reqs:
			if total+len(r) > api.MaxShareBatch {
				sh.pending = r
				return reqs, false, nil
			}
			reqs, total = append(reqs, r), total+len(r)
		default:
			return reqs, false, nil
		}
	}
}

// write hands the kernel one reply. A reply to a request the kernel
// withdrew (interrupted) is dropped, as the kernel drops it.
func (sh *share) write(reply []byte) error {
	_, err := unix.Write(sh.dev, reply)
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}

// close stops the reader, unmounts the share and closes the device, which
// ends the connection: a guest process still using a file there gets an
// error. The mount point's directory is removed.
func (sh *share) close() error {
	var err error
	sh.once.Do(func() {
		close(sh.stopped)
		_, _ = unix.Write(sh.wake, []byte{1, 0, 0, 0, 0, 0, 0, 0})
		<-sh.done
		if uerr := unix.Unmount(sh.path, unix.MNT_DETACH); uerr != nil && !errors.Is(uerr, unix.EINVAL) {
			err = fmt.Errorf("unmount %s: %w", sh.path, uerr)
		}
		unix.Close(sh.dev)
		unix.Close(sh.wake)
		if err == nil {
			_ = os.Remove(sh.path)
		}
	})
	return err
}
