package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/containerd/console"
	runc "github.com/containerd/go-runc"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/server/procio"
)

// stdio is the agent's side of a container process's stdio.
type stdio struct {
	stdout, stderr *procio.Output // stderr is nil with a terminal

	mu    sync.Mutex
	stdin *os.File // nil once closed, or when there is none
	pty   *os.File // the terminal's master, or nil
	pipes runc.IO  // every end of the pipes, or nil
}

// newPipes makes the pipes runc passes to the process as its stdio, owned
// by uid and gid so the process can reopen them.
func newPipes(uid, gid int, withStdin bool) (runc.IO, *stdio, error) {
	pio, err := runc.NewPipeIO(uid, gid, func(o *runc.IOOption) { o.OpenStdin = withStdin })
	if err != nil {
		return nil, nil, fmt.Errorf("create stdio pipes: %w", err)
	}
	out, _ := pio.Stdout().(*os.File)
	errf, _ := pio.Stderr().(*os.File)
	s := &stdio{stdout: procio.NewOutput(out, false), stderr: procio.NewOutput(errf, false), pipes: pio}
	if withStdin {
		s.stdin, _ = pio.Stdin().(*os.File)
	}
	return pio, s, nil
}

// newTerminal keeps the master of the terminal runc made, received on its
// console socket.
func newTerminal(sock *runc.Socket) (*stdio, error) {
	c, err := sock.ReceiveMaster()
	if err != nil {
		return nil, fmt.Errorf("receive the terminal: %w", err)
	}
	defer c.Close()
	return keepMaster(c)
}

// keepMaster keeps a copy of a terminal's master as a pollable file; the
// caller closes c.
func keepMaster(c console.Console) (*stdio, error) {
	fd, err := unix.FcntlInt(c.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("keep the terminal: %w", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("keep the terminal: %w", err)
	}
	f := os.NewFile(uintptr(fd), "pty")
	return &stdio{stdout: procio.NewOutput(f, true), stdin: f, pty: f}, nil
}

// write writes all of b to the process's stdin.
func (s *stdio) write(ctx context.Context, b []byte) error {
	s.mu.Lock()
	f := s.stdin
	s.mu.Unlock()
	if f == nil {
		return errNoStdin
	}
	return procio.Write(ctx, f, b)
}

var errNoStdin = errors.New("no open stdin")

// closeStdin closes a pipe stdin; on a terminal it sends end-of-file.
func (s *stdio) closeStdin() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stdin == nil {
		return nil
	}
	err := procio.CloseStdin(s.stdin, s.pty != nil)
	s.stdin = nil
	return err
}

// resize sets the terminal's window size.
func (s *stdio) resize(width, height uint32) error {
	if s.pty == nil {
		return errNoTerminal
	}
	return procio.Resize(s.pty, width, height)
}

var errNoTerminal = errors.New("no terminal")

// close releases the agent's ends.
func (s *stdio) close() {
	s.mu.Lock()
	if s.stdin != nil && s.stdin != s.pty {
		s.stdin.Close()
	}
	s.stdin = nil
	s.mu.Unlock()
	for _, st := range []*procio.Output{s.stdout, s.stderr} {
		if st != nil {
			st.Close()
		}
	}
	if s.pipes != nil {
		// Also the read end of stdin, which runc.IO keeps.
		_ = s.pipes.Close()
	}
}
