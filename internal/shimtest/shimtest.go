// Package shimtest has the fakes the shim's start tests share: a task
// server (the test binary itself) serving the socket it was handed, and a
// containerd ttrpc socket for spares to watch.
package shimtest

import (
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// Files a fake server writes into its working dir (the task's bundle).
const (
	PIDFile  = "server.pid"
	ArgsFile = "server.args"
	EnvFile  = "server.env"
)

// Serve is a fake task server's main: it records its pid, arguments and
// environment (one per line) in its working dir, then accepts on the task socket at fd 3 until the test
// kills it.
func Serve() {
	l, err := net.FileListener(os.NewFile(3, "socket"))
	if err != nil {
		os.Exit(2)
	}
	record(ArgsFile, strings.Join(os.Args, " "))
	record(EnvFile, strings.Join(os.Environ(), "\n"))
	record(PIDFile, strconv.Itoa(os.Getpid()))
	for {
		c, err := l.Accept()
		if err != nil {
			os.Exit(0)
		}
		c.Close()
	}
}

// KillAtCleanup kills pid, a server or spare the test started (so its
// child), when t ends, and reaps it.
func KillAtCleanup(t *testing.T, pid int) {
	t.Cleanup(func() {
		if err := unix.Kill(pid, unix.SIGKILL); err == nil {
			var ws unix.WaitStatus
			_, _ = unix.Wait4(pid, &ws, 0, nil)
		}
	})
}

// record writes a file whole before it appears, so a test that finds it
// reads all of it.
func record(name, data string) {
	if os.WriteFile(name+".tmp", []byte(data), 0o600) == nil {
		_ = os.Rename(name+".tmp", name)
	}
}

// Containerd listens at a containerd ttrpc address that spares watch; it
// accepts and holds their connections. Stop (also run at the test's
// cleanup) is containerd stopping, which ends every spare watching it.
type Containerd struct {
	Addr  string
	l     net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

// NewContainerd listens at addr and sets TTRPC_ADDRESS to it for the test,
// as containerd does for its shims.
func NewContainerd(t *testing.T, addr string) *Containerd {
	t.Helper()
	l, err := net.Listen("unix", addr)
	if err != nil {
		t.Fatal(err)
	}
	c := &Containerd{Addr: addr, l: l}
	go c.accept()
	t.Setenv("TTRPC_ADDRESS", addr)
	t.Cleanup(c.Stop)
	return c
}

func (c *Containerd) accept() {
	for {
		conn, err := c.l.Accept()
		if err != nil {
			return
		}
		c.mu.Lock()
		c.conns = append(c.conns, conn)
		c.mu.Unlock()
	}
}

// Stop closes the socket and every connection to it.
func (c *Containerd) Stop() {
	c.l.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.conns {
		conn.Close()
	}
	c.conns = nil
}
