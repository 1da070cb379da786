package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// redialInterval spaces out dial attempts while the guest is not up yet.
const redialInterval = 20 * time.Millisecond

// DialUnix connects to the host end of the guest's virtio-serial port (the
// QEMU chardev socket) and opens a new agent session on it. It returns when
// the guest agent answers, or fails when ctx ends first.
func DialUnix(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("dial agent socket: %w", err)
	}
	return openSession(ctx, conn)
}

// DialHybridVsock connects to guest vsock port through a Cloud Hypervisor or
// Firecracker hybrid vsock socket: "CONNECT <port>\n" answered by "OK <n>\n".
func DialHybridVsock(ctx context.Context, path string, port uint32) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("dial hybrid vsock: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	err = vsockHandshake(conn, port)
	if !stop() {
		err = errors.Join(err, ctx.Err())
	}
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("connect to guest vsock port %d via %s: %w", port, path, err)
	}
	return conn, nil
}

func vsockHandshake(conn net.Conn, port uint32) error {
	if _, err := fmt.Fprintf(conn, "CONNECT %d\n", port); err != nil {
		return err
	}
	// Read byte by byte: what follows the reply line belongs to the caller.
	var line []byte
	b := make([]byte, 1)
	for len(line) < 64 {
		if _, err := conn.Read(b); err != nil {
			return fmt.Errorf("read handshake reply: %w", err)
		}
		if b[0] == '\n' {
			return checkVsockReply(string(line))
		}
		line = append(line, b[0])
	}
	return fmt.Errorf("handshake reply %q is too long", line)
}

func checkVsockReply(line string) error {
	n, ok := strings.CutPrefix(line, "OK ")
	if !ok {
		return fmt.Errorf("handshake refused: %q, expected \"OK <port>\"", line)
	}
	if _, err := strconv.ParseUint(n, 10, 32); err != nil {
		return fmt.Errorf("handshake reply %q: bad port: %w", line, err)
	}
	return nil
}

// WaitReady dials the guest agent until it answers a Ping, or ctx ends.
func WaitReady(ctx context.Context, dial func(ctx context.Context) (net.Conn, error)) (*Client, error) {
	return redial(ctx, func() (*Client, error) { return tryReady(ctx, dial) })
}

// Connect dials the guest agent until it accepts a connection, or ctx
// ends, and makes no call: a restore's first call is Init, which the agent
// answers once it serves, sparing the guest a round trip. On an Eager ctx
// it returns before the agent accepted the session (Client.Accepted).
func Connect(ctx context.Context, dial func(ctx context.Context) (net.Conn, error)) (*Client, error) {
	return redial(ctx, func() (*Client, error) {
		conn, err := dial(ctx)
		if err != nil {
			return nil, err
		}
		return NewClient(conn), nil
	})
}

// redial tries until try succeeds or ctx ends.
func redial(ctx context.Context, try func() (*Client, error)) (*Client, error) {
	var last error
	for {
		c, err := try()
		if err == nil {
			return c, nil
		}
		last = err
		t := time.NewTimer(redialInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("wait for guest agent: %w (last attempt: %v)", ctx.Err(), last)
		case <-t.C:
		}
	}
}

func tryReady(ctx context.Context, dial func(ctx context.Context) (net.Conn, error)) (*Client, error) {
	conn, err := dial(ctx)
	if err != nil {
		return nil, err
	}
	c := NewClient(conn)
	if err := c.Ping(ctx); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}
