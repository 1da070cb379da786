package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
)

// maxRead bounds one ReadOutput reply.
const maxRead = 32 << 10

// veof is what closing a terminal's stdin sends: the end-of-file character.
const veof = 0x04

// outputStream is the agent's read end of a process's stdout or stderr.
type outputStream struct {
	mu  sync.Mutex // one reader at a time
	f   *os.File
	pty bool
}

// read blocks until the stream has data, reaches its end, or ctx ends.
func (s *outputStream) read(ctx context.Context, max int) ([]byte, bool, error) {
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

// drain reads and drops the rest of the stream, then closes it; a
// detached process's output goes nowhere, and a reader may have left a
// read deadline behind (a ReadOutput cancelled as its session ended), so
// it waits out that reader and clears the deadline first.
func (s *outputStream) drain() {
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

// writeStdin writes all of b to the process's stdin.
func (p *process) writeStdin(ctx context.Context, b []byte) error {
	p.stdinMu.Lock()
	f := p.stdin
	p.stdinMu.Unlock()
	if f == nil {
		return fmt.Errorf("process %q has no open stdin: %w", p.id, errdefs.ErrFailedPrecondition)
	}
	_ = f.SetWriteDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { _ = f.SetWriteDeadline(time.Now()) })
	defer stop()
	if _, err := f.Write(b); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("write stdin of %q: %w", p.id, err)
	}
	return nil
}

// closeStdin closes a pipe stdin; on a terminal it sends end-of-file, which
// ends a reader in canonical mode the way ^D does.
func (p *process) closeStdin() error {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin == nil {
		return nil
	}
	var err error
	if p.terminal {
		_, err = p.stdin.Write([]byte{veof})
	} else {
		err = p.stdin.Close()
	}
	p.stdin = nil
	if err != nil {
		return fmt.Errorf("close stdin of %q: %w", p.id, err)
	}
	return nil
}
