// Package uffd is the userfaultfd page-fault handler behind Firecracker's
// Uffd memory backend, cocoon's "ondemand" restore mode on Firecracker.
//
// The handler listens on a unix socket named in PUT /snapshot/load
// (mem_backend {backend_type: Uffd, backend_path: SOCK}). Firecracker maps
// guest memory anonymously, registers it with a userfaultfd, connects and
// sends one message: a JSON array of GuestRegionUffdMapping with the
// userfaultfd in SCM_RIGHTS. From then on every first touch of a guest page
// is a fault the handler resolves with UFFDIO_COPY from the staged memory
// file (or the zero page for holes).
//
// Balloon semantics follow Firecracker's documentation: a range Firecracker
// gives back with madvise(MADV_DONTNEED) arrives as UFFD_EVENT_REMOVE, and
// any later fault inside it is resolved with a zero page, never with the
// snapshot's stale bytes.
//
// The handler ends when Close is called, its context is cancelled, or
// Firecracker exits. The kernel never reports a hang-up on a userfaultfd
// whose faulting process exited (the handler holds its own reference), so
// the handler watches Firecracker's pid, taken from SO_PEERCRED, through a
// pidfd.
package uffd

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// handshakeTimeout bounds the wait for Firecracker's message once it has
// connected; it sends the message right after connecting.
const handshakeTimeout = 10 * time.Second

// Stats counts what the handler did.
type Stats struct {
	// Faults is the number of page faults resolved.
	Faults uint64
	// Copied is the number of pages copied from the memory file.
	Copied uint64
	// Zeroed is the number of faults resolved with the zero page: holes in
	// the memory file and ranges removed by the balloon.
	Zeroed uint64
	// Removes is the number of UFFD_EVENT_REMOVE events received.
	Removes uint64
	// Retries is the number of resolutions refused with EAGAIN (a remove
	// was in flight) and tried again.
	Retries uint64
}

type counters struct {
	faults, copied, zeroed, removes, retries atomic.Uint64
}

// Handler serves one Firecracker process's page faults.
type Handler struct {
	log    *log.Entry
	ln     *net.UnixListener
	mem    *memFile
	stopFD int // eventfd: written once to stop the serving goroutine
	stats  counters

	mu        sync.Mutex
	conn      *net.UnixConn // the connection while the handshake is read
	stopping  bool
	stopCtx   func() bool
	closeOnce sync.Once

	done chan struct{}
	err  error
}

// Listen maps memPath, listens on sockPath and starts serving in the
// background. The socket exists when Listen returns, so Firecracker may be
// told about it right away. Cancelling ctx stops the handler like Close;
// ctx also carries the logger. Close must always be called.
func Listen(ctx context.Context, sockPath, memPath string) (*Handler, error) {
	mem, err := openMemFile(memPath)
	if err != nil {
		return nil, err
	}
	stopFD, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		mem.close()
		return nil, fmt.Errorf("create stop eventfd: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sockPath, Net: "unix"})
	if err != nil {
		unix.Close(stopFD)
		mem.close()
		return nil, fmt.Errorf("listen on uffd socket: %w", err)
	}
	h := &Handler{
		log:    log.G(ctx).WithField("socket", sockPath),
		ln:     ln,
		mem:    mem,
		stopFD: stopFD,
		done:   make(chan struct{}),
	}
	h.stopCtx = context.AfterFunc(ctx, h.stop)
	go h.run()
	return h, nil
}

// Wait blocks until the handler has ended and returns why it failed, or nil
// when it ended because of Close, ctx or Firecracker's exit.
func (h *Handler) Wait() error {
	<-h.done
	return h.err
}

// Close stops the handler, waits for it and releases everything it holds;
// the socket is gone when it returns. It is safe to call more than once.
func (h *Handler) Close() error {
	h.stopCtx()
	h.stop()
	<-h.done
	var err error
	h.closeOnce.Do(func() {
		if cerr := unix.Close(h.stopFD); cerr != nil {
			err = fmt.Errorf("close stop eventfd: %w", cerr)
		}
	})
	return err
}

// Stats returns the counters so far.
func (h *Handler) Stats() Stats {
	return Stats{
		Faults:  h.stats.faults.Load(),
		Copied:  h.stats.copied.Load(),
		Zeroed:  h.stats.zeroed.Load(),
		Removes: h.stats.removes.Load(),
		Retries: h.stats.retries.Load(),
	}
}

// stop wakes the serving goroutine in whatever phase it is: accepting,
// reading the handshake, or polling the userfaultfd.
func (h *Handler) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopping {
		return
	}
	h.stopping = true
	h.ln.Close()
	if h.conn != nil {
		h.conn.Close()
	}
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	unix.Write(h.stopFD, one[:])
}

func (h *Handler) isStopping() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stopping
}

func (h *Handler) run() {
	defer close(h.done)
	defer h.mem.close()
	h.err = h.serve()
	if h.err != nil {
		h.log.WithError(h.err).Error("uffd handler failed")
	}
}

func (h *Handler) serve() error {
	p, err := h.handshake()
	if err != nil || p == nil {
		return err
	}
	defer unix.Close(p.uffd)
	regions, err := validateMappings(p.mappings, h.mem.size(), uint64(unix.Getpagesize()))
	if err != nil {
		return fmt.Errorf("firecracker handshake: %w", err)
	}
	pidfd, err := unix.PidfdOpen(p.pid, 0)
	if errors.Is(err, unix.ESRCH) {
		h.log.WithField("pid", p.pid).Info("firecracker exited before its first fault")
		return nil
	}
	if err != nil {
		return fmt.Errorf("watch firecracker pid %d: %w", p.pid, err)
	}
	defer unix.Close(pidfd)
	h.log.WithFields(log.Fields{"pid": p.pid, "regions": len(regions)}).Debug("serving page faults")
	s := &server{uffd: p.uffd, regions: regions, mem: h.mem, stats: &h.stats, log: h.log}
	return s.loop(h.stopFD, pidfd)
}

// handshake accepts Firecracker's one connection, stops listening (which
// removes the socket) and reads the message. It returns nil, nil when the
// handler was stopped first.
func (h *Handler) handshake() (*peer, error) {
	conn, err := h.ln.AcceptUnix()
	h.ln.Close()
	if err != nil {
		if h.isStopping() {
			return nil, nil
		}
		return nil, fmt.Errorf("accept firecracker: %w", err)
	}
	defer conn.Close()
	if !h.setConn(conn) {
		return nil, nil
	}
	defer h.setConn(nil)
	if err := conn.SetReadDeadline(time.Now().Add(handshakeTimeout)); err != nil {
		return nil, fmt.Errorf("set handshake deadline: %w", err)
	}
	p, err := readHandshake(conn)
	if err != nil {
		if h.isStopping() {
			return nil, nil
		}
		return nil, fmt.Errorf("firecracker handshake: %w", err)
	}
	return &p, nil
}

// setConn publishes the connection being read so stop can close it; it
// reports false when the handler is already stopping.
func (h *Handler) setConn(c *net.UnixConn) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.conn = c
	return !h.stopping
}
