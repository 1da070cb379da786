// Package ports is the guest's end of kubectl port-forward: TCP
// connections the agent opens to ports the guest listens on, whose bytes
// the host pulls and pushes a call at a time, as it does a process's stdio.
package ports

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// dialTimeout bounds a connect to the guest's own loopback, which answers
// at once unless the listener's backlog is full.
const dialTimeout = 5 * time.Second

// loopbacks are where a port is looked for, in order: a server listening
// on any address, or on IPv4's loopback only, answers the first; one on
// IPv6's loopback only, the second.
var loopbacks = []string{"127.0.0.1", "::1"}

// Conns are the open port connections, served as the agent API's port calls.
type Conns struct {
	dialer net.Dialer

	mu      sync.Mutex
	next    uint64
	opening int // connections being opened, counted against the bound
	conns   map[uint64]*conn
}

// conn is one open connection; one read at a time.
type conn struct {
	net.Conn
	rmu sync.Mutex
}

// New returns an empty set that connects with the guest's TCP stack.
func New() *Conns {
	return &Conns{dialer: net.Dialer{Timeout: dialTimeout}, conns: map[uint64]*conn{}}
}

// OpenPort connects to req's port on the guest's loopback.
func (r *Conns) OpenPort(ctx context.Context, req *api.OpenPortRequest) (*api.OpenPortResponse, error) {
	if req.Port == 0 || req.Port > 65535 {
		return nil, fmt.Errorf("open port %d: a TCP port is 1 to 65535: %w", req.Port, errdefs.ErrInvalidArgument)
	}
	if !r.reserve() {
		return nil, fmt.Errorf("open port %d: %d port connections are open, the most the agent keeps: %w",
			req.Port, api.MaxPortConns, errdefs.ErrResourceExhausted)
	}
	c, err := r.connect(ctx, req.Port)
	if err != nil {
		r.release()
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.opening--
	r.next++
	r.conns[r.next] = &conn{Conn: c}
	return &api.OpenPortResponse{Id: r.next}, nil
}

// reserve counts a connection about to open against the bound.
func (r *Conns) reserve() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.conns)+r.opening >= api.MaxPortConns {
		return false
	}
	r.opening++
	return true
}

func (r *Conns) release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.opening--
}

func (r *Conns) connect(ctx context.Context, port uint32) (net.Conn, error) {
	var errs []error
	for _, host := range loopbacks {
		c, err := r.dialer.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(int(port))))
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("connect to port %d in the guest: %w: %w", port, errors.Join(errs...), errdefs.ErrUnavailable)
}

// ReadPort blocks until the connection has data, reaches its end, or the
// call ends, and returns that data with whatever else arrived meanwhile:
// at most max_bytes (api.MaxPortChunk when 0).
func (r *Conns) ReadPort(ctx context.Context, req *api.ReadPortRequest) (*api.ReadOutputResponse, error) {
	c, err := r.get(req.Id)
	if err != nil {
		return nil, err
	}
	max := int(req.MaxBytes)
	if max <= 0 || max > api.MaxPortChunk {
		max = api.MaxPortChunk
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	_ = c.SetReadDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { _ = c.SetReadDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, max)
	n, err := c.Read(buf)
	if err == nil {
		n += c.readQueued(buf[n:])
	}
	switch {
	case err == nil:
		return &api.ReadOutputResponse{Data: buf[:n]}, nil
	case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed):
		return &api.ReadOutputResponse{Data: buf[:n], Eof: true}, nil
	case errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() != nil:
		return nil, ctx.Err()
	}
	return nil, fmt.Errorf("read port connection %d: %w", req.Id, err)
}

// readQueued reads into buf what the socket holds already, without
// waiting for more.
func (c *conn) readQueued(buf []byte) int {
	rc, err := c.Conn.(syscall.Conn).SyscallConn()
	if err != nil {
		return 0
	}
	queued := 0
	_ = rc.Control(func(fd uintptr) { queued, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	if queued <= 0 || len(buf) == 0 {
		return 0
	}
	n, _ := io.ReadFull(c.Conn, buf[:min(queued, len(buf))])
	return n
}

// WritePort writes all of req's data, giving up when the call ends.
func (r *Conns) WritePort(ctx context.Context, req *api.WritePortRequest) (*emptypb.Empty, error) {
	if len(req.Data) > api.MaxPortChunk {
		return nil, fmt.Errorf("write port connection %d: %d bytes, at most %d a call: %w", req.Id, len(req.Data), api.MaxPortChunk, errdefs.ErrInvalidArgument)
	}
	c, err := r.get(req.Id)
	if err != nil {
		return nil, err
	}
	_ = c.SetWriteDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { _ = c.SetWriteDeadline(time.Now()) })
	defer stop()
	if _, err := c.Write(req.Data); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("write port connection %d: %w", req.Id, err)
	}
	return &emptypb.Empty{}, nil
}

// ClosePort half-closes the connection (write_only) or closes and forgets it.
func (r *Conns) ClosePort(ctx context.Context, req *api.ClosePortRequest) (*emptypb.Empty, error) {
	if req.WriteOnly {
		c, err := r.get(req.Id)
		if err != nil {
			return nil, err
		}
		if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
			if err := cw.CloseWrite(); err != nil {
				return nil, fmt.Errorf("half-close port connection %d: %w", req.Id, err)
			}
		}
		return &emptypb.Empty{}, nil
	}
	r.mu.Lock()
	c, ok := r.conns[req.Id]
	delete(r.conns, req.Id)
	r.mu.Unlock()
	if !ok {
		return nil, notOpen(req.Id)
	}
	_ = c.Close()
	return &emptypb.Empty{}, nil
}

func (r *Conns) get(id uint64) (*conn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.conns[id]
	if !ok {
		return nil, notOpen(id)
	}
	return c, nil
}

func notOpen(id uint64) error {
	return fmt.Errorf("port connection %d is not open: %w", id, errdefs.ErrNotFound)
}
