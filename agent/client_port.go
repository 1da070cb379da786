package agent

import (
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// maxPortInFlight bounds the bytes all of a client's port connections
// send at once: half the send queue, which other calls (files, stdin)
// share. A chunk waits for room under its connection's context.
const maxPortInFlight = maxQueued / 2

// PortConn is a TCP connection the agent made to a port on the guest's
// loopback: kubectl port-forward's path into the VM. Its bytes travel as a
// process's stdio does, pulled and pushed a call at a time, so one slow
// connection slows only itself.
type PortConn struct {
	Port uint16

	c    *Client
	id   uint64
	r    *outputReader
	w    *stdinWriter // its end is the half-close
	once sync.Once
}

// DialPort connects to port on the guest's loopback (127.0.0.1, then
// ::1). Nothing listening there fails it as errdefs.ErrUnavailable.
func (c *Client) DialPort(ctx context.Context, port uint16) (*PortConn, error) {
	if err := c.requireVersion(ctx, apiVersion7, "port-forward"); err != nil {
		return nil, err
	}
	resp, err := c.api.OpenPort(ctx, &api.OpenPortRequest{Port: uint32(port)})
	if err != nil {
		return nil, fmt.Errorf("connect to port %d in guest: %w", port, native(err))
	}
	p := &PortConn{Port: port, c: c, id: resp.Id}
	what := fmt.Sprintf("guest port %d connection %d", port, resp.Id)
	p.r = newPuller(what, func(ctx context.Context, max uint32) (*api.ReadOutputResponse, error) {
		return c.api.ReadPort(ctx, &api.ReadPortRequest{Id: p.id, MaxBytes: max})
	})
	p.w = newPusher(what, func(ctx context.Context, data []byte) error {
		if err := c.portBytes.Acquire(ctx, int64(len(data))); err != nil {
			return err
		}
		defer c.portBytes.Release(int64(len(data)))
		_, err := c.api.WritePort(ctx, &api.WritePortRequest{Id: p.id, Data: data})
		return err
	}, func(ctx context.Context) error { return p.close(ctx, true) })
	p.r.chunk, p.w.chunk = api.MaxPortChunk, api.MaxPortChunk
	return p, nil
}

// Read returns what the guest's side sent; io.EOF once it closed its side.
func (p *PortConn) Read(b []byte) (int, error) { return p.r.Read(b) }

// Write sends b to the guest's side.
func (p *PortConn) Write(b []byte) (int, error) { return p.w.Write(b) }

// WriteTo copies what the guest's side sends to w until its end, a call
// of up to api.MaxPortChunk bytes at a time (io.Copy's buffer would make
// each call carry 32 KiB).
func (p *PortConn) WriteTo(w io.Writer) (int64, error) {
	return copyChunks(w, p.r)
}

// ReadFrom sends what r reads to the guest's side until r's end, up to
// api.MaxPortChunk bytes a call.
func (p *PortConn) ReadFrom(r io.Reader) (int64, error) {
	return copyChunks(p.w, r)
}

// copyChunks copies through a buffer of api.MaxPortChunk bytes. The
// wrappers hide w's ReadFrom and r's WriteTo, which io.CopyBuffer would
// take instead of the buffer (a net.Conn's copies with 32 KiB of its own).
func copyChunks(w io.Writer, r io.Reader) (int64, error) {
	return io.CopyBuffer(struct{ io.Writer }{w}, struct{ io.Reader }{r}, make([]byte, api.MaxPortChunk))
}

// CloseWrite tells the guest's side that nothing more comes; what it sends
// back can still be read.
func (p *PortConn) CloseWrite() error { return p.w.Close() }

// Close ends the connection: reads and writes in progress return
// os.ErrClosed, and the agent closes and forgets its end.
func (p *PortConn) Close() error {
	var err error
	p.once.Do(func() {
		p.r.Close()
		p.w.cancel()
		ctx, cancel := context.WithTimeout(context.Background(), stdinCloseTimeout)
		defer cancel()
		err = p.close(ctx, false)
	})
	return err
}

func (p *PortConn) close(ctx context.Context, writeOnly bool) error {
	if _, err := p.c.api.ClosePort(ctx, &api.ClosePortRequest{Id: p.id, WriteOnly: writeOnly}); err != nil {
		return fmt.Errorf("close guest port %d connection %d: %w", p.Port, p.id, native(err))
	}
	return nil
}
