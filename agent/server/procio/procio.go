// Package procio is a guest process's stdio as the agent holds it: output
// the host pulls a read at a time, a stdin it writes and closes, a terminal
// it resizes. The agent's own processes and the containers runc starts for
// it share these.
package procio

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// MaxRead bounds one read of a process's output.
const MaxRead = 32 << 10

// veof is what closing a terminal's stdin sends: the end-of-file character.
const veof = 0x04

// Output is the agent's read end of a process's stdout or stderr, or of
// its terminal.
type Output struct {
	mu  sync.Mutex // one reader at a time
	f   *os.File
	pty bool
}

// NewOutput reads f, a pollable pipe or, with pty, a terminal's master.
func NewOutput(f *os.File, pty bool) *Output { return &Output{f: f, pty: pty} }

// Read blocks until the stream has data, reaches its end, or ctx ends; it
// returns at most max bytes (MaxRead when max is not in (0, MaxRead]).
func (s *Output) Read(ctx context.Context, max int) ([]byte, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if max <= 0 || max > MaxRead {
		max = MaxRead
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

// Drain reads and drops the rest of the stream, then closes it; a
// detached process's output goes nowhere, and a reader may have left a
// read deadline behind (a read cancelled as its session ended), so it
// waits out that reader and clears the deadline first.
func (s *Output) Drain() {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.f.Close()
	for {
		// A cancelled read's deadline can still land after its reply.
		_ = s.f.SetReadDeadline(time.Time{})
		if _, err := io.Copy(io.Discard, s.f); !errors.Is(err, os.ErrDeadlineExceeded) {
			return
		}
	}
}

// Close closes the read end; a blocked Read returns at its end.
func (s *Output) Close() error { return s.f.Close() }

// Write writes all of b to the stdin f, giving up when ctx ends.
func Write(ctx context.Context, f *os.File, b []byte) error {
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

// CloseStdin closes a pipe stdin; on a terminal it sends end-of-file, which
// ends a reader in canonical mode the way ^D does, and leaves the master
// open for the output.
func CloseStdin(f *os.File, terminal bool) error {
	var err error
	if terminal {
		_, err = f.Write([]byte{veof})
	} else {
		err = f.Close()
	}
	if err != nil {
		return fmt.Errorf("close stdin: %w", err)
	}
	return nil
}

// Resize sets the window size of the terminal whose master is pty.
func Resize(pty *os.File, width, height uint32) error {
	rc, err := pty.SyscallConn()
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
