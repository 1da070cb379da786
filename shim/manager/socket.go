package manager

import (
	"context"
	"fmt"
	"net"
	"os"

	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/errdefs"
)

// serverSocket is the listening socket handed to the task server.
type serverSocket struct {
	addr string
	l    *net.UnixListener
	f    *os.File
}

// Close releases the socket and removes its path.
func (s *serverSocket) Close() {
	if s.l != nil {
		s.l.Close()
	}
	if s.f != nil {
		s.f.Close()
	}
	_ = shim.RemoveSocket(s.addr)
}

// listen creates the socket for group under socketDir. If a live server of
// the same group already listens there it returns that address with
// errdefs.ErrAlreadyExists; a stale socket left by a crashed server is
// replaced.
func listen(ctx context.Context, socketDir, containerdAddress, group string) (*serverSocket, error) {
	addr, err := shim.CreateSocketAddress(ctx, socketDir, containerdAddress, group, false)
	if err != nil {
		return nil, fmt.Errorf("shim socket address: %w", err)
	}
	l, err := shim.NewSocket(addr)
	if err != nil {
		if !shim.SocketEaddrinuse(err) {
			return nil, fmt.Errorf("create shim socket: %w", err)
		}
		if shim.CanConnect(addr) {
			return &serverSocket{addr: addr}, errdefs.ErrAlreadyExists
		}
		if err := shim.RemoveSocket(addr); err != nil {
			return nil, fmt.Errorf("remove stale shim socket: %w", err)
		}
		if l, err = shim.NewSocket(addr); err != nil {
			return nil, fmt.Errorf("create shim socket: %w", err)
		}
	}
	s := &serverSocket{addr: addr, l: l}
	if s.f, err = l.File(); err != nil {
		s.Close()
		return nil, fmt.Errorf("shim socket file: %w", err)
	}
	return s, nil
}
