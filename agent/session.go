package agent

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// sessionConn is one host connection carried in frames of a shared stream.
type sessionConn struct {
	id      uint64
	w       *frameWriter
	pr      *io.PipeReader
	pw      *io.PipeWriter
	once    sync.Once
	onClose func()
}

func newSessionConn(id uint64, w *frameWriter, onClose func()) *sessionConn {
	pr, pw := io.Pipe()
	return &sessionConn{id: id, w: w, pr: pr, pw: pw, onClose: onClose}
}

// deliver hands a DATA payload to the reader; it blocks until read or closed.
func (c *sessionConn) deliver(p []byte) {
	_, _ = c.pw.Write(p)
}

// end makes pending and later reads return io.EOF.
func (c *sessionConn) end() {
	_ = c.pw.Close()
}

func (c *sessionConn) Read(p []byte) (int, error) {
	return c.pr.Read(p)
}

func (c *sessionConn) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), maxFramePayload)]
		if err := c.w.writeFrame(frame{typ: frameData, session: c.id, payload: chunk}); err != nil {
			return n, fmt.Errorf("write agent session %x: %w", c.id, err)
		}
		n += len(chunk)
		p = p[len(chunk):]
	}
	return n, nil
}

func (c *sessionConn) Close() error {
	c.once.Do(func() {
		_ = c.pr.CloseWithError(net.ErrClosed)
		if c.onClose != nil {
			c.onClose()
		}
	})
	return nil
}

type sessionAddr uint64

func (a sessionAddr) Network() string { return "cocoon-agent-session" }
func (a sessionAddr) String() string  { return fmt.Sprintf("session-%016x", uint64(a)) }

func (c *sessionConn) LocalAddr() net.Addr  { return sessionAddr(c.id) }
func (c *sessionConn) RemoteAddr() net.Addr { return sessionAddr(c.id) }

var errNoDeadlines = errors.New("agent sessions have no deadlines; use a context")

func (c *sessionConn) SetDeadline(time.Time) error      { return errNoDeadlines }
func (c *sessionConn) SetReadDeadline(time.Time) error  { return errNoDeadlines }
func (c *sessionConn) SetWriteDeadline(time.Time) error { return errNoDeadlines }
