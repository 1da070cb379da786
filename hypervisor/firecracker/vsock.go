package firecracker

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"time"
)

// agentPort is the guest agent's vsock port.
const agentPort = 1024

// handshakeTimeout bounds the CONNECT handshake once connected.
const handshakeTimeout = 5 * time.Second

// dialHybridVsock opens a stream to guest vsock port through the vsock
// device's host socket: "CONNECT <port>\n" answered by "OK <n>\n".
func dialHybridVsock(ctx context.Context, path string, port uint32) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("dial vsock socket: %w", err)
	}
	deadline := time.Now().Add(handshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c.SetDeadline(deadline)
	br := bufio.NewReaderSize(c, 64)
	_, err = fmt.Fprintf(c, "CONNECT %d\n", port)
	var line string
	if err == nil {
		line, err = br.ReadString('\n')
	}
	if err == nil && !strings.HasPrefix(line, "OK ") {
		err = fmt.Errorf("got %q, want OK", strings.TrimSpace(line))
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("vsock handshake for port %d: %w", port, err)
	}
	c.SetDeadline(time.Time{})
	return &bufferedConn{Conn: c, r: br}, nil
}

// bufferedConn keeps bytes the guest sent right after its OK line.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
