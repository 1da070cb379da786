package agent

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

const (
	// stdioChunk bounds one stdin write or output read; it fits one frame.
	stdioChunk = 32 << 10
	// stdinCloseTimeout bounds ending a stdin, which a paused guest does
	// not answer.
	stdinCloseTimeout = 5 * time.Second
	// maxEmptyReads bounds the ReadOutput replies in a row with neither data
	// nor end of stream: the agent never sends one, so a guest that keeps
	// doing it is broken. Retries back off from emptyReadBackoff.
	maxEmptyReads    = 8
	emptyReadBackoff = time.Millisecond
)

// Process is a process Exec or Start started in the guest.
type Process struct {
	ID  string
	Pid uint32 // 0 from an agent that predates reporting it

	c               *Client
	terminal, stdin bool
}

func (c *Client) process(r ExecRequest, pid uint32) *Process {
	return &Process{ID: r.ID, Pid: pid, c: c, terminal: r.Terminal, stdin: r.Stdin}
}

// Stdio returns the process's streams; take them once, as each call makes
// new readers of the same streams. stdin is nil unless the process was
// started with Stdin. With a terminal, stdout carries the pty and stderr
// is nil. stdout and stderr return io.EOF once the process's output has
// been fully delivered.
func (p *Process) Stdio() (stdin io.WriteCloser, stdout, stderr io.ReadCloser) {
	if p.stdin {
		stdin = newStdinWriter(p.c, p.ID)
	}
	stdout = newOutputReader(p.c, p.ID, api.Stream_STDOUT)
	if !p.terminal {
		stderr = newOutputReader(p.c, p.ID, api.Stream_STDERR)
	}
	return stdin, stdout, stderr
}

// outputReader pulls one output stream with ReadOutput calls, so the guest
// sends only what the reader asks for.
type outputReader struct {
	what   string                                                                 // the stream, as errors name it
	chunk  int                                                                    // bounds one read call
	pull   func(ctx context.Context, max uint32) (*api.ReadOutputResponse, error) // one read call
	ctx    context.Context
	cancel context.CancelFunc
	eof    bool
}

func newOutputReader(c *Client, id string, stream api.Stream) *outputReader {
	return newPuller(streamName(stream, id), func(ctx context.Context, max uint32) (*api.ReadOutputResponse, error) {
		return c.api.ReadOutput(ctx, &api.ReadOutputRequest{Id: id, Stream: stream, MaxBytes: max})
	})
}

// streamName is how errors name a process's output stream.
func streamName(stream api.Stream, id string) string {
	return fmt.Sprintf("%s of %q", stream, id)
}

func newPuller(what string, pull func(context.Context, uint32) (*api.ReadOutputResponse, error)) *outputReader {
	ctx, cancel := context.WithCancel(context.Background())
	return &outputReader{what: what, chunk: stdioChunk, pull: pull, ctx: ctx, cancel: cancel}
}

func (r *outputReader) Read(p []byte) (int, error) {
	if r.eof {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	for empty := 0; ; empty++ {
		if empty == maxEmptyReads {
			return 0, fmt.Errorf("read %s: the guest answered %d reads with neither data nor end of stream: %w",
				r.what, empty, errdefs.ErrDataLoss)
		}
		if empty > 0 && !sleepCtx(r.ctx, emptyReadBackoff<<(empty-1)) {
			return 0, os.ErrClosed
		}
		want := min(len(p), r.chunk)
		resp, err := r.pull(r.ctx, uint32(want))
		if err != nil {
			if r.ctx.Err() != nil {
				return 0, os.ErrClosed
			}
			return 0, fmt.Errorf("read %s: %w", r.what, native(err))
		}
		if len(resp.Data) > want {
			return 0, fmt.Errorf("read %s: the guest sent %d bytes, %d were asked for: %w",
				r.what, len(resp.Data), want, errdefs.ErrDataLoss)
		}
		r.eof = resp.Eof
		if n := copy(p, resp.Data); n > 0 || r.eof {
			if n == 0 {
				return 0, io.EOF
			}
			return n, nil
		}
	}
}

// sleepCtx waits for d; false if ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Close abandons the stream; a Read in progress returns os.ErrClosed.
func (r *outputReader) Close() error {
	r.cancel()
	return nil
}

// stdinWriter writes a process's stdin with WriteStdin calls. Close ends
// a write in progress: an agent that does not answer (a paused VM) cannot
// hold the writer, or the caller closing it, for ever.
type stdinWriter struct {
	what   string                                       // the stream, as errors name it
	chunk  int                                          // bounds one write call
	push   func(ctx context.Context, data []byte) error // one write call
	end    func(ctx context.Context) error              // the close call
	ctx    context.Context
	cancel context.CancelFunc
	once   sync.Once
}

func newStdinWriter(c *Client, id string) *stdinWriter {
	return newPusher(fmt.Sprintf("stdin of %q", id), func(ctx context.Context, data []byte) error {
		_, err := c.api.WriteStdin(ctx, &api.WriteStdinRequest{Id: id, Data: data})
		return err
	}, func(ctx context.Context) error { return c.CloseStdin(ctx, id) })
}

func newPusher(what string, push func(context.Context, []byte) error, end func(context.Context) error) *stdinWriter {
	ctx, cancel := context.WithCancel(context.Background())
	return &stdinWriter{what: what, chunk: stdioChunk, push: push, end: end, ctx: ctx, cancel: cancel}
}

func (w *stdinWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), w.chunk)]
		if err := w.push(w.ctx, chunk); err != nil {
			if w.ctx.Err() != nil {
				return n, os.ErrClosed
			}
			return n, fmt.Errorf("write %s: %w", w.what, native(err))
		}
		n += len(chunk)
		p = p[len(chunk):]
	}
	return n, nil
}

// Close abandons a write in progress and ends the process's stdin, waiting
// at most stdinCloseTimeout for the agent.
func (w *stdinWriter) Close() error {
	var err error
	w.once.Do(func() {
		w.cancel()
		ctx, cancel := context.WithTimeout(context.Background(), stdinCloseTimeout)
		defer cancel()
		err = w.end(ctx)
	})
	return err
}
