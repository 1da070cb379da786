package agent_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// upperServer answers each connection with what it read, upper-cased,
// once its peer half-closed.
func upperServer(t *testing.T) uint16 {
	return testenv.ServeTCP(t, func(c net.Conn) {
		b, _ := io.ReadAll(c)
		_, _ = c.Write([]byte(strings.ToUpper(string(b))))
	})
}

// TestDialPortConcurrent carries many connections at once through one
// agent session, each with a half-close the server waits for.
func TestDialPortConcurrent(t *testing.T) {
	c := newHarness(t).client(t)
	port := upperServer(t)
	payload := strings.Repeat("abcdefgh", 320<<10) // 2.5 MiB: several reads and writes
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- roundTrip(t, c, port, fmt.Sprintf("%d:%s", i, payload))
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// roundTrip sends msg, half-closes and reads the answer to its end.
func roundTrip(t *testing.T, c *agent.Client, port uint16, msg string) error {
	p, err := c.DialPort(ctxT(t), port)
	if err != nil {
		return err
	}
	defer p.Close()
	// io.Copy takes PortConn's ReadFrom and WriteTo, the relay's path.
	if _, err := io.Copy(p, strings.NewReader(msg)); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if err := p.CloseWrite(); err != nil {
		return fmt.Errorf("half-close: %w", err)
	}
	var got strings.Builder
	_, err = io.Copy(&got, p)
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if want := strings.ToUpper(msg); got.String() != want {
		return fmt.Errorf("got %d bytes %.20q..., want %d bytes %.20q...", got.Len(), got.String(), len(want), want)
	}
	return nil
}

func TestDialPortRefused(t *testing.T) {
	c := newHarness(t).client(t)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	if _, err := c.DialPort(ctxT(t), port); !errdefs.IsUnavailable(err) {
		t.Fatalf("dial a port nothing listens on: %v, want Unavailable", err)
	}
}

func TestPortConnClose(t *testing.T) {
	c := newHarness(t).client(t)
	p, err := c.DialPort(ctxT(t), upperServer(t))
	if err != nil {
		t.Fatal(err)
	}
	read := make(chan error, 1)
	go func() {
		_, err := p.Read(make([]byte, 8))
		read <- err
	}()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-read; !errors.Is(err, os.ErrClosed) {
		t.Fatalf("read interrupted by Close: %v, want os.ErrClosed", err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}
