package ports

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// echoServer echoes each connection until its peer half-closes, then
// says "bye" and closes.
func echoServer(t *testing.T) uint32 {
	return uint32(testenv.ServeTCP(t, func(c net.Conn) {
		_, _ = io.Copy(c, c)
		_, _ = c.Write([]byte("bye"))
	}))
}

// freePort is a loopback port nothing listens on.
func freePort(t *testing.T) uint32 {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := uint32(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	return port
}

func open(t *testing.T, c *Conns, port uint32) uint64 {
	t.Helper()
	resp, err := c.OpenPort(context.Background(), &api.OpenPortRequest{Port: port})
	if err != nil {
		t.Fatalf("OpenPort(%d): %v", port, err)
	}
	return resp.Id
}

// readAll reads the connection to its end.
func readAll(t *testing.T, c *Conns, id uint64) string {
	t.Helper()
	var got []byte
	for {
		resp, err := c.ReadPort(context.Background(), &api.ReadPortRequest{Id: id, MaxBytes: 2})
		if err != nil {
			t.Fatalf("ReadPort: %v", err)
		}
		if len(resp.Data) > 2 {
			t.Fatalf("ReadPort returned %d bytes, 2 were asked for", len(resp.Data))
		}
		got = append(got, resp.Data...)
		if resp.Eof {
			return string(got)
		}
	}
}

func TestEchoWithHalfClose(t *testing.T) {
	c := New()
	id := open(t, c, echoServer(t))
	ctx := context.Background()
	if _, err := c.WritePort(ctx, &api.WritePortRequest{Id: id, Data: []byte("hello")}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ClosePort(ctx, &api.ClosePortRequest{Id: id, WriteOnly: true}); err != nil {
		t.Fatal(err)
	}
	// The server answers only after our half-close reached it: what it
	// sends after reading our end still arrives.
	if got := readAll(t, c, id); got != "hellobye" {
		t.Fatalf("read %q, want %q", got, "hellobye")
	}
	if _, err := c.ClosePort(ctx, &api.ClosePortRequest{Id: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ClosePort(ctx, &api.ClosePortRequest{Id: id}); !errdefs.IsNotFound(err) {
		t.Fatalf("second close: %v, want NotFound", err)
	}
}

func TestRefusals(t *testing.T) {
	c := New()
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		call func() error
		want func(error) bool
	}{
		{"port 0", func() error { _, err := c.OpenPort(ctx, &api.OpenPortRequest{}); return err }, errdefs.IsInvalidArgument},
		{"port 65536", func() error { _, err := c.OpenPort(ctx, &api.OpenPortRequest{Port: 65536}); return err }, errdefs.IsInvalidArgument},
		{"nothing listens", func() error { _, err := c.OpenPort(ctx, &api.OpenPortRequest{Port: freePort(t)}); return err }, errdefs.IsUnavailable},
		{"read unknown", func() error { _, err := c.ReadPort(ctx, &api.ReadPortRequest{Id: 9}); return err }, errdefs.IsNotFound},
		{"write unknown", func() error { _, err := c.WritePort(ctx, &api.WritePortRequest{Id: 9}); return err }, errdefs.IsNotFound},
		{"half-close unknown", func() error {
			_, err := c.ClosePort(ctx, &api.ClosePortRequest{Id: 9, WriteOnly: true})
			return err
		}, errdefs.IsNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); !tc.want(err) {
				t.Fatalf("got %v", err)
			}
		})
	}
	if len(c.conns) != 0 || c.opening != 0 {
		t.Fatalf("refused calls left %d connections, %d opening", len(c.conns), c.opening)
	}
}

func TestBound(t *testing.T) {
	c := New()
	port := echoServer(t)
	for range api.MaxPortConns {
		open(t, c, port)
	}
	_, err := c.OpenPort(context.Background(), &api.OpenPortRequest{Port: port})
	if !errdefs.IsResourceExhausted(err) {
		t.Fatalf("open past the bound: %v, want ResourceExhausted", err)
	}
	if _, err := c.ClosePort(context.Background(), &api.ClosePortRequest{Id: 1}); err != nil {
		t.Fatal(err)
	}
	open(t, c, port) // a closed connection frees its place
	for id := range c.conns {
		_, _ = c.ClosePort(context.Background(), &api.ClosePortRequest{Id: id})
	}
}

func TestReadEndsWithTheCall(t *testing.T) {
	c := New()
	id := open(t, c, echoServer(t))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.ReadPort(ctx, &api.ReadPortRequest{Id: id}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read with nothing to read: %v, want the call's deadline", err)
	}
	// The connection still works after a read gave up.
	if _, err := c.WritePort(context.Background(), &api.WritePortRequest{Id: id, Data: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	resp, err := c.ReadPort(context.Background(), &api.ReadPortRequest{Id: id})
	if err != nil || string(resp.Data) != "x" {
		t.Fatalf("read after a cancelled read: %q, %v", resp.GetData(), err)
	}
	_, _ = c.ClosePort(context.Background(), &api.ClosePortRequest{Id: id})
}
