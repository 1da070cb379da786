package agent_test

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// TestAgent runs every agent case against the server in-process, behind a
// fake QEMU chardev socket.
func TestAgent(t *testing.T) {
	testenv.RequireRoot(t) // setuid to the requested uid, ptys
	h := newHarness(t)
	tg := &target{c: h.client(t), dial: h.dial}
	t.Cleanup(func() { _ = tg.c.Close() })
	for _, tc := range agentCases {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, tg) })
	}
}

func TestInitAndShutdown(t *testing.T) {
	h := newHarness(t)
	c := h.client(t)
	ctx := ctxT(t)
	now := time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)
	entropy := []byte("0123456789abcdef")
	sysctls := map[string]string{"kernel.shm_rmid_forced": "1"}
	if _, err := c.Init(ctx, agent.InitRequest{Time: now, Entropy: entropy, Hostname: "clone-1", Sysctls: sysctls}); err != nil {
		t.Fatal(err)
	}
	h.sys.mu.Lock()
	if !h.sys.time.Equal(now) || !bytes.Equal(h.sys.entropy, entropy) || h.sys.hostname != "clone-1" || !maps.Equal(h.sys.sysctls, sysctls) {
		t.Errorf("init set time %v entropy %q hostname %q sysctls %v", h.sys.time, h.sys.entropy, h.sys.hostname, h.sys.sysctls)
	}
	h.sys.mu.Unlock()
	if err := c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.sys.off:
	case <-ctx.Done():
		t.Fatal("shutdown did not power off")
	}
	if !h.sys.synced {
		t.Error("shutdown did not sync first")
	}
}

// TestDialTimeout: with nothing answering, dialing fails when ctx ends.
func TestDialTimeout(t *testing.T) {
	sock := silentListener(t)
	for _, tc := range []struct {
		name string
		dial func(ctx context.Context) (net.Conn, error)
	}{
		{"silent guest", func(ctx context.Context) (net.Conn, error) { return agent.DialUnix(ctx, sock) }},
		{"no socket", func(ctx context.Context) (net.Conn, error) { return agent.DialUnix(ctx, sock+"-missing") }},
		{"silent vsock", func(ctx context.Context) (net.Conn, error) { return agent.DialHybridVsock(ctx, sock, agent.VsockPort) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			c, err := agent.WaitReady(ctx, tc.dial)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("WaitReady: %v, want deadline exceeded", err)
			}
			if c != nil {
				c.Close()
			}
		})
	}
}

func TestHybridVsockHandshake(t *testing.T) {
	for _, tc := range []struct {
		name, reply string
		ok          bool
	}{
		{"accepted", "OK 1073741824\n", true},
		{"refused", "ERROR no listener\n", false},
		{"bad port", "OK x\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "v")
			ln, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			got := make(chan string, 1)
			go fakeHybridVsock(ln, tc.reply, got)
			ctx := ctxT(t)
			conn, err := agent.DialHybridVsock(ctx, sock, agent.VsockPort)
			if <-got != "CONNECT 1024\n" {
				t.Error("handshake did not send CONNECT 1024")
			}
			if (err == nil) != tc.ok {
				t.Fatalf("dial: %v, want success %v", err, tc.ok)
			}
			if err != nil {
				return
			}
			defer conn.Close()
			buf := make([]byte, 5)
			if _, err := conn.Read(buf); err != nil || string(buf) != "hello" {
				t.Errorf("after handshake read %q %v, want the stream's first bytes", buf, err)
			}
		})
	}
}

// fakeHybridVsock answers one CONNECT with reply, then sends "hello".
func fakeHybridVsock(ln net.Listener, reply string, got chan<- string) {
	c, err := ln.Accept()
	if err != nil {
		got <- ""
		return
	}
	defer c.Close()
	buf := make([]byte, 64)
	n, _ := c.Read(buf)
	got <- string(buf[:n])
	_, _ = c.Write([]byte(reply + "hello"))
	_, _ = c.Read(buf) // until the client closes
}

// BenchmarkPing measures a call's round trip through the session framing
// and ttrpc, in-process.
func BenchmarkPing(b *testing.B) {
	c := newHarness(b).client(b)
	ctx := context.Background()
	for b.Loop() {
		if err := c.Ping(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// TestEagerSession: on an Eager context the dial returns before the agent
// accepts, the first call rides behind the SYN, and Accepted reports the
// acceptance; a silent guest never accepts.
func TestEagerSession(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	c, err := agent.Connect(agent.Eager(ctx), h.dial)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Init(ctx, agent.InitRequest{Hostname: "eager"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Accepted(ctx); err != nil {
		t.Errorf("Accepted after an answered call: %v", err)
	}
	h.sys.mu.Lock()
	got := h.sys.hostname
	h.sys.mu.Unlock()
	if got != "eager" {
		t.Errorf("guest hostname %q, want eager", got)
	}

	sock := silentListener(t)
	sctx, scancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer scancel()
	silent, err := agent.Connect(agent.Eager(sctx), func(ctx context.Context) (net.Conn, error) { return agent.DialUnix(ctx, sock) })
	if err != nil {
		t.Fatalf("eager dial of a silent guest: %v, want the session at once", err)
	}
	defer silent.Close()
	if err := silent.Accepted(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Accepted of a silent guest: %v, want deadline exceeded", err)
	}
}

// silentListener is a unix socket that accepts connections and never
// answers on them; it closes with t.
func silentListener(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c) // accept, never answer
		}
	}()
	return sock
}
