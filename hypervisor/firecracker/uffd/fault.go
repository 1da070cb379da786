package uffd

import (
	"errors"
	"fmt"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

const (
	// batch is how many messages one read(2) of the userfaultfd may return.
	batch = 64
	// retryMillis is the poll timeout while faults wait for a retry: the
	// kernel refuses UFFDIO_COPY with EAGAIN while a remove it announced is
	// still being applied, and sends no event when that finishes.
	retryMillis = 1
)

// errPeerGone means Firecracker's memory is gone: it exited or is exiting.
var errPeerGone = errors.New("firecracker address space is gone")

// server resolves the faults of one userfaultfd. Only its goroutine touches
// it; stats are atomics so Handler.Stats may read them meanwhile.
type server struct {
	uffd    int
	regions []Mapping // validated: sorted, host-page-sized
	mem     *memFile
	stats   *counters
	log     *log.Entry

	removed rangeSet // host addresses given back by the balloon
	retry   []uint64 // page addresses whose resolution hit EAGAIN
	buf     [batch * msgSize]byte
}

// loop polls the userfaultfd, the stop eventfd and Firecracker's pidfd until
// one of the latter two fires or the userfaultfd hangs up or fails.
func (s *server) loop(stopFD, pidfd int) error {
	fds := []unix.PollFd{
		{Fd: int32(s.uffd), Events: unix.POLLIN},
		{Fd: int32(stopFD), Events: unix.POLLIN},
		{Fd: int32(pidfd), Events: unix.POLLIN},
	}
	for {
		timeout := -1
		if len(s.retry) > 0 {
			timeout = retryMillis
		}
		if _, err := unix.Poll(fds, timeout); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return fmt.Errorf("poll userfaultfd: %w", err)
		}
		switch {
		case fds[1].Revents != 0:
			return nil
		case fds[2].Revents != 0:
			s.log.Debug("firecracker exited")
			return nil
		case fds[0].Revents&unix.POLLHUP != 0:
			s.log.Debug("userfaultfd hung up")
			return nil
		case fds[0].Revents&(unix.POLLERR|unix.POLLNVAL) != 0:
			return fmt.Errorf("poll userfaultfd: revents %#x", fds[0].Revents)
		}
		err := s.drain()
		if err == nil {
			err = s.retryPending()
		}
		if errors.Is(err, errPeerGone) {
			s.log.Debug("firecracker memory is gone")
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// drain reads and handles every queued message.
func (s *server) drain() error {
	for {
		n, err := unix.Read(s.uffd, s.buf[:])
		switch {
		case errors.Is(err, unix.EAGAIN):
			return nil
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return fmt.Errorf("read userfaultfd: %w", err)
		case n == 0:
			return errPeerGone
		case n%msgSize != 0:
			return fmt.Errorf("read userfaultfd: %d bytes is not a whole number of %d-byte messages", n, msgSize)
		}
		for off := 0; off < n; off += msgSize {
			if err := s.handle(decodeMessage(s.buf[off : off+msgSize])); err != nil {
				return err
			}
		}
	}
}

func (s *server) handle(m message) error {
	switch m.Event {
	case eventPagefault:
		return s.fault(m.A)
	case eventRemove:
		s.removed.add(m.A, m.B)
		s.stats.removes.Add(1)
	case eventFork:
		// Only sent if Firecracker asked for UFFD_FEATURE_EVENT_FORK, which
		// it does not; close the child's descriptor so it cannot leak.
		unix.Close(int(m.A))
		s.log.Warn("ignoring userfaultfd fork event")
	default:
		s.log.WithField("event", m.Event).Debug("ignoring userfaultfd event")
	}
	return nil
}

// retryPending retries the faults that hit EAGAIN; they may hit it again.
func (s *server) retryPending() error {
	pending := s.retry
	s.retry = nil
	for _, page := range pending {
		if err := s.fault(page); err != nil {
			return err
		}
	}
	return nil
}

// fault resolves the fault at addr for its whole page.
func (s *server) fault(addr uint64) error {
	r, ok := s.region(addr)
	if !ok {
		return fmt.Errorf("page fault at %#x is outside every region Firecracker sent", addr)
	}
	size := r.PageSize
	page := addr &^ (size - 1)
	err := s.resolve(r, page, size)
	switch {
	case err == nil:
	case errors.Is(err, unix.EAGAIN):
		s.retry = append(s.retry, page)
		s.stats.retries.Add(1)
		return nil
	case errors.Is(err, unix.EEXIST):
		// An earlier message for the same page already filled it; the
		// faulting thread may still be asleep.
		if err := wake(s.uffd, page, size); err != nil {
			return fmt.Errorf("wake fault at %#x: %w", page, err)
		}
	case errors.Is(err, unix.ESRCH):
		return errPeerGone
	case errors.Is(err, unix.ENOENT):
		// The range was unmapped meanwhile (Firecracker tearing down):
		// nobody waits for this page any more.
		return nil
	default:
		return fmt.Errorf("resolve fault at %#x: %w", page, err)
	}
	s.stats.faults.Add(1)
	return nil
}

// resolve fills page: the zero page if the balloon removed it or the file
// has a hole there, else a copy of the file's bytes.
func (s *server) resolve(r Mapping, page, size uint64) error {
	off := r.Offset + (page - r.BaseHostVirtAddr)
	if s.removed.intersects(page, page+size) || s.mem.isHole(off, size) {
		if err := zeroPage(s.uffd, page, size); err != nil {
			return err
		}
		s.stats.zeroed.Add(1)
		return nil
	}
	if err := copyPage(s.uffd, page, s.mem.addr(off), size); err != nil {
		return err
	}
	s.stats.copied.Add(1)
	return nil
}

func (s *server) region(addr uint64) (Mapping, bool) {
	for _, r := range s.regions {
		if addr >= r.BaseHostVirtAddr && addr-r.BaseHostVirtAddr < r.Size {
			return r, true
		}
	}
	return Mapping{}, false
}
