package container

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	runc "github.com/containerd/go-runc"
	"golang.org/x/sys/unix"
)

// maxRead bounds one read of a process's output.
const maxRead = 32 << 10

// veof is what closing a terminal's stdin sends: the end-of-file character.
const veof = 0x04

// stream is the agent's read end of a container process's stdout or
// stderr, or of its terminal.
type stream struct {
	mu  sync.Mutex // one reader at a time
	f   *os.File
	pty bool
}

// read blocks until the stream has data, reaches its end, or ctx ends.
func (s *stream) read(ctx context.Context, max int) ([]byte, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if max <= 0 || max > maxRead {
		max = maxRead
	}
	_ = s.f.SetReadDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { _ = s.f.SetReadDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, max)
	n, err := s.f.Read(buf)
	switch {
	case err == nil:
		return buf[:n], false, nil
	case errors.Is(err, io.EOF), s.pty && errors.Is(err, syscall.EIO):
		// A pty master reads EIO once the last slave is closed.
		return buf[:n], true, nil
	case errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() != nil:
		return nil, false, ctx.Err()
	case errors.Is(err, os.ErrClosed):
		return nil, true, nil
	}
	return nil, false, fmt.Errorf("read output: %w", err)
}

// stdio is the agent's side of a container process's stdio.
type stdio struct {
	stdout, stderr *stream // stderr is nil with a terminal

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
	s := &stdio{stdout: &stream{f: out}, stderr: &stream{f: errf}, pipes: pio}
	if withStdin {
		s.stdin, _ = pio.Stdin().(*os.File)
	}
	return pio, s, nil
}

// newTerminal keeps the master of the terminal runc made, received on its
// console socket, as a pollable file.
func newTerminal(sock *runc.Socket) (*stdio, error) {
	c, err := sock.ReceiveMaster()
	if err != nil {
		return nil, fmt.Errorf("receive the terminal: %w", err)
	}
	defer c.Close()
	fd, err := unix.FcntlInt(c.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("keep the terminal: %w", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("keep the terminal: %w", err)
	}
	f := os.NewFile(uintptr(fd), "pty")
	return &stdio{stdout: &stream{f: f, pty: true}, stdin: f, pty: f}, nil
}

// write writes all of b to the process's stdin.
func (s *stdio) write(ctx context.Context, b []byte) error {
	s.mu.Lock()
	f := s.stdin
	s.mu.Unlock()
	if f == nil {
		return errNoStdin
	}
	_ = f.SetWriteDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { _ = f.SetWriteDeadline(time.Now()) })
	defer stop()
	if _, err := f.Write(b); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("write stdin: %w", err)
	}
	return nil
}

var errNoStdin = errors.New("no open stdin")

// closeStdin closes a pipe stdin; on a terminal it sends end-of-file, as
// ^D does.
func (s *stdio) closeStdin() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stdin == nil {
		return nil
	}
	var err error
	if s.pty != nil {
		_, err = s.stdin.Write([]byte{veof})
	} else {
		err = s.stdin.Close()
	}
	s.stdin = nil
	if err != nil {
		return fmt.Errorf("close stdin: %w", err)
	}
	return nil
}

// resize sets the terminal's window size.
func (s *stdio) resize(width, height uint32) error {
	if s.pty == nil {
		return errNoTerminal
	}
	rc, err := s.pty.SyscallConn()
	if err != nil {
		return fmt.Errorf("resize the terminal: %w", err)
	}
	ws := &unix.Winsize{Col: uint16(width), Row: uint16(height)}
	var ioErr error
	if err := rc.Control(func(fd uintptr) { ioErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, ws) }); err != nil {
		ioErr = err
	}
	if ioErr != nil {
		return fmt.Errorf("resize the terminal: %w", ioErr)
	}
	return nil
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
	for _, st := range []*stream{s.stdout, s.stderr} {
		if st != nil {
			st.f.Close()
		}
	}
	if s.pipes != nil {
		// Also the read end of stdin, which runc.IO keeps.
		_ = s.pipes.Close()
	}
}
