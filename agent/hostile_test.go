package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// watchdog bounds how long a test waits for a call that must return: a
// call still blocked after it is a hang, not a slow machine.
const watchdog = 20 * time.Second

// rawGuest plays the guest end of the agent's port on a unix socket: it
// acknowledges the host's session, then hands the stream to serve.
type rawGuest struct {
	sock string
	conn chan net.Conn
}

// newRawGuest serves one host; serve runs after the ACK, with the reader
// of the host's next frames (which it may leave unread) and the connection
// to write to.
func newRawGuest(t *testing.T, serve func(session uint64, r *frameReader, conn net.Conn)) *rawGuest {
	t.Helper()
	dir, err := os.MkdirTemp("", "cocoon-raw-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	g := &rawGuest{sock: filepath.Join(dir, "agent.sock"), conn: make(chan net.Conn, 1)}
	ln, err := net.Listen("unix", g.sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		g.conn <- conn
		r := newFrameReader(conn)
		for {
			f, err := r.readFrame()
			if err != nil {
				return
			}
			if f.typ == frameSyn {
				if newFrameWriter(conn).writeFrame(frame{typ: frameAck, session: f.session}) == nil {
					serve(f.session, r, conn)
				}
				return
			}
		}
	}()
	t.Cleanup(func() {
		select {
		case c := <-g.conn:
			c.Close()
		default:
		}
	})
	return g
}

func (g *rawGuest) client(t *testing.T) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), watchdog)
	defer cancel()
	conn, err := DialUnix(ctx, g.sock)
	if err != nil {
		t.Fatal(err)
	}
	c := NewClient(conn)
	t.Cleanup(func() {
		if err := returnsIn(watchdog, c.Close); err != nil {
			t.Error(err)
		}
	})
	return c
}

// deafGuest acknowledges the session and then reads nothing more, as a
// guest whose agent hung or whose VM is paused.
func deafGuest(t *testing.T) *Client {
	return newRawGuest(t, func(uint64, *frameReader, net.Conn) {}).client(t)
}

// returns runs call and fails t if it is still blocked after the watchdog.
func returns(t *testing.T, what string, call func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- call() }()
	select {
	case err := <-done:
		return err
	case <-time.After(watchdog):
		t.Fatalf("%s still blocked after %v", what, watchdog)
		return nil
	}
}

// returnsIn runs call, giving up on it after d.
func returnsIn(d time.Duration, call func() error) error {
	done := make(chan error, 1)
	go func() { done <- call() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		return fmt.Errorf("still blocked after %v", d)
	}
}

// bigInit is an Init whose request is larger than a unix socket's buffers,
// so writing it blocks while the guest reads nothing.
func bigInit() InitRequest {
	return InitRequest{Hostname: "stuck", Entropy: bytes.Repeat([]byte{frameEnd}, 800<<10)}
}

// TestInitHonoursContext: Init to a guest that reads nothing returns when
// its context ends.
func TestInitHonoursContext(t *testing.T) {
	c := deafGuest(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := returns(t, "Init with a 1s context", func() error { _, err := c.Init(ctx, bigInit()); return err })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Init: %v, want deadline exceeded", err)
	}
}

// TestSignalBehindStuckWrite: a call whose write is stuck (here an Init
// without deadline) does not hold up another call past its context.
func TestSignalBehindStuckWrite(t *testing.T) {
	g := newRawGuest(t, func(uint64, *frameReader, net.Conn) {})
	c := g.client(t)
	initDone := make(chan error, 1)
	go func() { _, err := c.Init(context.Background(), bigInit()); initDone <- err }()
	waitStuck(t, g)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := returns(t, "Signal with a 1s context", func() error { return c.Signal(ctx, "p", syscall.SIGKILL) })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Signal: %v, want deadline exceeded", err)
	}
	returns(t, "Close", c.Close)
	if err := returns(t, "Init after Close", func() error { return <-initDone }); !errors.Is(err, ttrpc.ErrClosed) {
		t.Errorf("Init in flight at Close: %v, want ttrpc.ErrClosed", err)
	}
}

// TestCloseWithStuckWrite: Close returns while a write to the guest is
// stuck, and ends the connection.
func TestCloseWithStuckWrite(t *testing.T) {
	g := newRawGuest(t, func(uint64, *frameReader, net.Conn) {})
	c := g.client(t)
	go func() { _, _ = c.Init(context.Background(), bigInit()) }()
	conn := waitStuck(t, g)
	returns(t, "Close", c.Close)
	// The host end is closed, though the guest still reads nothing:
	// writing to it then fails.
	err := returns(t, "the host closing the connection", func() error {
		for {
			if _, err := conn.Write([]byte{frameEnd}); err != nil {
				return err
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	if !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("guest write after Close: %v, want a broken pipe", err)
	}
}

// waitStuck waits until the host's writes to g are stuck (the socket holds
// all it can) and returns g's end of the connection.
func waitStuck(t *testing.T, g *rawGuest) net.Conn {
	t.Helper()
	conn := <-g.conn
	g.conn <- conn // for the cleanup
	returns(t, "filling the guest's socket", func() error {
		for !hostStuck(t, conn) {
			time.Sleep(10 * time.Millisecond)
		}
		return nil
	})
	return conn
}

// hostStuck says whether the guest end has a full receive queue.
func hostStuck(t *testing.T, conn net.Conn) bool {
	rc, err := conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	_ = rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	return n >= 100<<10
}

// pingReply is a ttrpc Response carrying a PingResponse.
func pingReply(t *testing.T) []byte {
	payload, err := proto.Marshal(&api.PingResponse{Version: "1"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := proto.Marshal(&ttrpc.Response{Payload: payload})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestUnknownRepliesAreNotLoggedEach: a guest floods ~2 MiB of messages
// that answer no request; the host logs a few lines, not one per message,
// and the real reply behind them still arrives.
func TestUnknownRepliesAreNotLoggedEach(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flood func(req, i uint32) []byte
	}{
		{"replies on streams never opened", func(_, i uint32) []byte {
			return appendTTRPC(nil, 1001+2*i, ttrpcTypeResponse, []byte{1, 2})
		}},
		{"data on the request's stream", func(req, _ uint32) []byte {
			return appendTTRPC(nil, req, 3, []byte{1, 2})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lines := captureLog(t)
			c := floodingGuest(t, tc.flood).client(t)
			ctx, cancel := context.WithTimeout(context.Background(), watchdog)
			defer cancel()
			if err := c.Ping(ctx); err != nil {
				t.Fatalf("ping behind the flood: %v", err)
			}
			if n := lines(); n == 0 || n > 50 {
				t.Errorf("the flood logged %d lines, want a few (at least one)", n)
			}
		})
	}
}

// floodingGuest answers the host's first request with 2 MiB of the
// messages flood makes, then the real reply.
func floodingGuest(t *testing.T, flood func(req, i uint32) []byte) *rawGuest {
	return newRawGuest(t, func(session uint64, r *frameReader, conn net.Conn) {
		frames := make(chan frame, 16)
		go readFrames(r, frames)
		req := firstRequest(frames)
		go func() {
			for range frames {
			}
		}()
		var b []byte
		for i := uint32(0); len(b) < 2<<20; i++ {
			b = append(b, flood(req, i)...)
		}
		b = appendTTRPC(b, req, ttrpcTypeResponse, pingReply(t))
		w := newFrameWriter(conn)
		for len(b) > 0 {
			n := min(len(b), maxFramePayload)
			if w.writeFrame(frame{typ: frameData, session: session, payload: b[:n]}) != nil {
				return
			}
			b = b[n:]
		}
	})
}

// captureLog sends log.L's output to a counter until t ends.
func captureLog(t *testing.T) (lines func() int) {
	var mu sync.Mutex
	var buf bytes.Buffer
	l := log.L.Logger
	old := l.Out
	l.SetOutput(lockedWriter{&mu, &buf})
	t.Cleanup(func() { l.SetOutput(old) })
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		return strings.Count(buf.String(), "\n")
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}

// firstRequest waits for the host's first ttrpc request and returns its
// stream id.
func firstRequest(frames <-chan frame) uint32 {
	var b []byte
	for f := range frames {
		if f.typ != frameData {
			continue
		}
		b = append(b, f.payload...)
		if len(b) >= ttrpcHeaderLen {
			return parseTTRPCHeader(b).stream
		}
	}
	return 0
}

func appendTTRPC(b []byte, stream uint32, typ byte, payload []byte) []byte {
	var h [ttrpcHeaderLen]byte
	binary.BigEndian.PutUint32(h[0:], uint32(len(payload)))
	binary.BigEndian.PutUint32(h[4:], stream)
	h[8] = typ
	return append(append(b, h[:]...), payload...)
}

// readFrames copies the host's frames (payloads copied) to out until the
// connection fails; out is closed then.
func readFrames(r *frameReader, out chan<- frame) {
	defer close(out)
	for {
		f, err := r.readFrame()
		if err != nil {
			return
		}
		f.payload = bytes.Clone(f.payload)
		out <- f
	}
}

// TestSendQueueBounded: a guest that reads nothing at all makes writes
// fail once maxQueued bytes wait, and the connection closes.
func TestSendQueueBounded(t *testing.T) {
	host, guest := net.Pipe()
	defer guest.Close()
	q := newSendQueue(host)
	chunk := make([]byte, 1<<20)
	var err error
	for i := 0; i <= maxQueued/len(chunk)+1 && err == nil; i++ {
		_, err = q.Write(chunk)
	}
	if !errors.Is(err, errGuestNotReading) {
		t.Fatalf("write past the bound: %v, want the guest not reading", err)
	}
	if _, err := q.Write([]byte{1}); !errors.Is(err, errGuestNotReading) {
		t.Errorf("a later write: %v, want the same failure", err)
	}
	// The connection ends: reading what was sent reaches its end.
	if err := returnsIn(watchdog, func() error { _, err := io.Copy(io.Discard, guest); return err }); err != nil {
		t.Errorf("the connection stayed open: %v", err)
	}
}
