package network

import (
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
)

// dialIn connects to 127.0.0.1:port from inside n, as containerd's CRI
// does to forward a port.
func dialIn(t *testing.T, n *Namespace, port int) (net.Conn, error) {
	t.Helper()
	var c net.Conn
	err := n.Do(func() error {
		var err error
		c, err = net.DialTimeout("tcp4", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
		return err
	})
	return c, err
}

func TestLoopbackListener(t *testing.T) {
	n := newNS(t)
	l, err := n.ListenLoopback()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	for _, port := range []int{80, 8080, 65535, l.ln.Addr().(*net.TCPAddr).Port} {
		c, err := dialIn(t, n, port)
		if err != nil {
			t.Fatalf("dial port %d in the namespace: %v", port, err)
		}
		got, gotPort, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		if int(gotPort) != port {
			t.Errorf("accepted a connection to port %d as port %d", port, gotPort)
		}
		// The two ends are one connection.
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(got, buf); err != nil || string(buf) != "ping" {
			t.Fatalf("read %q, %v", buf, err)
		}
		c.Close()
		got.Close()
	}
}

// TestLoopbackOnlyInside: the host's own loopback is not redirected, and
// the namespace's listener is not reachable from the host.
func TestLoopbackOnlyInside(t *testing.T) {
	n := newNS(t)
	l, err := n.ListenLoopback()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	port := l.ln.Addr().(*net.TCPAddr).Port
	c, err := net.DialTimeout("tcp4", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
	if err == nil {
		// Something of the host's own listens there: not ours either way.
		c.Close()
	}
	accepted := make(chan struct{})
	go func() {
		if c, _, err := l.Accept(); err == nil {
			c.Close()
			close(accepted)
		}
	}()
	select {
	case <-accepted:
		t.Fatal("a connection from outside the namespace reached its loopback listener")
	case <-time.After(200 * time.Millisecond):
	}
}

// TestLoopbackClose: after Close nothing listens and the redirect is gone,
// so a dial inside is refused at once; a second listener replaces a table
// a crashed holder left.
func TestLoopbackClose(t *testing.T) {
	n := newNS(t)
	stale, err := n.ListenLoopback()
	if err != nil {
		t.Fatal(err)
	}
	stale.ln.Close() // a holder that died: its table stays
	l, err := n.ListenLoopback()
	if err != nil {
		t.Fatalf("listen over a stale table: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := dialIn(t, n, 80); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatal("a dial inside the namespace connected after Close")
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(n.f.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		if tb.Name == loopbackTable {
			t.Errorf("table %s is still in the namespace after Close", loopbackTable)
		}
	}
}
