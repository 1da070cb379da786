package task

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/pkg/stdio"
	"github.com/containerd/fifo"
	"github.com/containerd/log"
)

// outputDrainTimeout bounds how long an exit waits for the process's output
// to reach containerd, so a stuck reader cannot hold the exit back forever.
const outputDrainTimeout = 5 * time.Second

// processIO copies one guest process's streams to and from containerd's
// stdio (FIFOs, file:// or binary:// URIs). With a terminal the guest owns the pty, so
// the host only relays bytes: no console is needed on this side.
type processIO struct {
	stdin    io.WriteCloser // to the guest
	stdinSrc io.ReadCloser  // containerd's stdin FIFO
	outputs  sync.WaitGroup // stdout and stderr copies
	closers  []io.Closer
	once     sync.Once
}

// ioOwner names the process's task to logging binaries.
type ioOwner struct{ id, namespace string }

// attachIO wires g to sio and starts copying.
func attachIO(ctx context.Context, sio stdio.Stdio, g Streams, owner ioOwner) (_ *processIO, retErr error) {
	ctx = context.WithoutCancel(ctx)
	pio := &processIO{stdin: g.Stdin}
	defer func() {
		if retErr != nil {
			pio.Close()
		}
	}()
	srcs := []io.ReadCloser{g.Stdout, g.Stderr}
	for _, src := range srcs {
		if src != nil {
			pio.closers = append(pio.closers, src)
		}
	}
	dsts, err := openOutputs(ctx, sio, pio, owner)
	if err != nil {
		return nil, err
	}
	for i, src := range srcs {
		if src == nil {
			continue
		}
		pio.outputs.Add(1)
		go pio.copyOut(ctx, dsts[i], src)
	}
	if sio.Stdin != "" && g.Stdin != nil {
		f, err := fifo.OpenFifo(ctx, sio.Stdin, syscall.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			return nil, fmt.Errorf("open stdin %s: %w", sio.Stdin, err)
		}
		pio.stdinSrc = f
		go pio.copyIn(ctx)
	}
	return pio, nil
}

func (p *processIO) copyOut(ctx context.Context, dst io.Writer, src io.Reader) {
	defer p.outputs.Done()
	if _, err := io.Copy(dst, src); err != nil && !closedErr(err) {
		log.G(ctx).WithError(err).Warn("copy guest output")
	}
}

func (p *processIO) copyIn(ctx context.Context) {
	if _, err := io.Copy(p.stdin, p.stdinSrc); err != nil && !closedErr(err) {
		log.G(ctx).WithError(err).Debug("copy stdin to guest")
	}
	p.CloseStdin()
}

// closedErr reports errors that only mean a stream was closed on purpose.
func closedErr(err error) bool {
	return errors.Is(err, os.ErrClosed) || errors.Is(err, io.ErrClosedPipe)
}

// CloseStdin ends the guest's stdin (EOF) and stops reading containerd's.
func (p *processIO) CloseStdin() {
	if p.stdinSrc != nil {
		p.stdinSrc.Close()
	}
	if p.stdin != nil {
		p.stdin.Close()
	}
}

// waitOutput waits until the guest's output has been copied out, the
// drain timeout passes, or ctx ends (the VM is gone: no more will come).
func (p *processIO) waitOutput(ctx context.Context) {
	done := make(chan struct{})
	go func() { p.outputs.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		log.G(ctx).Debug("stop waiting for process output: the VM is gone")
	case <-time.After(outputDrainTimeout):
		log.G(ctx).Warn("process output still flowing after exit; closing it")
	}
}

// Close releases every stream.
func (p *processIO) Close() {
	p.once.Do(func() {
		p.CloseStdin()
		for _, c := range p.closers {
			c.Close()
		}
	})
}

// openOutputs opens stdout and stderr destinations. Output with no
// destination is still drained, so the guest never blocks on it.
func openOutputs(ctx context.Context, sio stdio.Stdio, pio *processIO, owner ioOwner) ([2]io.Writer, error) {
	dsts := [2]io.Writer{io.Discard, io.Discard}
	if u, err := url.Parse(sio.Stdout); err == nil && (u.Scheme == "binary" || u.Scheme == "binary-v2") {
		l, err := startLogger(u, owner.id, owner.namespace)
		if err != nil {
			return dsts, err
		}
		pio.closers = append(pio.closers, l)
		return [2]io.Writer{l.stdout, l.stderr}, nil
	}
	opened := map[string]io.Writer{}
	for i, target := range []string{sio.Stdout, sio.Stderr} {
		if target == "" {
			continue
		}
		if w, ok := opened[target]; ok {
			dsts[i] = w
			continue
		}
		w, err := openOutput(ctx, target, pio)
		if err != nil {
			return dsts, err
		}
		opened[target] = w
		dsts[i] = w
	}
	return dsts, nil
}

// openOutput opens one containerd stdio target: a FIFO path (or fifo://)
// or a file:// URI; binary:// URIs are handled by openOutputs.
func openOutput(ctx context.Context, target string, pio *processIO) (io.Writer, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("parse stdio uri %q: %w", target, err)
	}
	switch u.Scheme {
	case "", "fifo":
		path := target
		if u.Scheme != "" {
			path = u.Path
		}
		return openFifoOutput(ctx, path, pio)
	case "file":
		if err := os.MkdirAll(filepath.Dir(u.Path), 0o755); err != nil {
			return nil, fmt.Errorf("create stdio file dir: %w", err)
		}
		f, err := os.OpenFile(u.Path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("open stdio file: %w", err)
		}
		pio.closers = append(pio.closers, f)
		return f, nil
	default:
		return nil, fmt.Errorf("stdio uri %q: scheme %q is not supported, want a fifo path, file:// or binary://", target, u.Scheme)
	}
}

// openFifoOutput opens a FIFO for writing. The shim also holds a read end,
// as runc's shim does, so opening never blocks on the client and writes do
// not fail with EPIPE while the client reconnects.
func openFifoOutput(ctx context.Context, path string, pio *processIO) (io.Writer, error) {
	w, err := fifo.OpenFifo(ctx, path, syscall.O_WRONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("open fifo %s for writing: %w", path, err)
	}
	pio.closers = append(pio.closers, w)
	r, err := fifo.OpenFifo(ctx, path, syscall.O_RDONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("open fifo %s for reading: %w", path, err)
	}
	pio.closers = append(pio.closers, r)
	return w, nil
}
