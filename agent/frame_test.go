package agent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

func TestFrameRoundTrip(t *testing.T) {
	var stream bytes.Buffer
	w := newFrameWriter(&stream)
	want := []frame{
		{typ: frameSyn, session: 1},
		{typ: frameData, session: 1, payload: []byte{frameEnd, frameEsc, 0, frameEscEnd, frameEscEsc}},
		{typ: frameData, session: 2, payload: bytes.Repeat([]byte{frameEnd}, maxFramePayload)},
		{typ: frameFin, session: 1},
	}
	for _, f := range want {
		if err := w.writeFrame(f); err != nil {
			t.Fatal(err)
		}
	}
	r := newFrameReader(&stream)
	for i, f := range want {
		got, err := r.readFrame()
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if got.typ != f.typ || got.session != f.session || !bytes.Equal(got.payload, f.payload) {
			t.Errorf("frame %d: got %v/%d/%d bytes, want %v/%d/%d bytes", i, got.typ, got.session, len(got.payload), f.typ, f.session, len(f.payload))
		}
	}
	if _, err := r.readFrame(); !errors.Is(err, io.EOF) {
		t.Errorf("after the last frame: %v, want EOF", err)
	}
}

// TestFrameReaderResyncs: cut frames, corrupted frames and noise before a
// delimiter are dropped; the next intact frame is read.
func TestFrameReaderResyncs(t *testing.T) {
	good := func(session uint64) []byte {
		var b bytes.Buffer
		_ = newFrameWriter(&b).writeFrame(frame{typ: frameData, session: session, payload: []byte("payload")})
		return b.Bytes()
	}
	corrupt := good(7)
	corrupt[5] ^= 0xff
	for _, tc := range []struct {
		name  string
		noise []byte
	}{
		{"cut frame", good(7)[:9]},
		{"corrupt frame", corrupt},
		{"bad escape", []byte{frameEnd, frameEsc, 'x', 1, 2, 3}},
		{"noise", []byte("half a ttrpc message from an old host")},
		{"oversized", bytes.Repeat([]byte{'a'}, maxFrameLen+10)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newFrameReader(bytes.NewReader(append(append([]byte{}, tc.noise...), good(9)...)))
			f, err := r.readFrame()
			if err != nil || f.session != 9 || string(f.payload) != "payload" {
				t.Errorf("read %v/%d %q %v, want session 9's frame", f.typ, f.session, f.payload, err)
			}
		})
	}
}

// relayPort is the guest end of a virtio-serial port whose host end can be
// switched to a new connection without the guest seeing a disconnect, as
// when a snapshot is restored with a new host already attached.
type relayPort struct {
	pr  *io.PipeReader
	pw  *io.PipeWriter
	mu  sync.Mutex
	cur net.Conn
}

func newRelayPort() *relayPort {
	pr, pw := io.Pipe()
	return &relayPort{pr: pr, pw: pw}
}

// attach connects a new host and returns its end.
func (p *relayPort) attach() net.Conn {
	host, relay := net.Pipe()
	p.mu.Lock()
	p.cur = relay
	p.mu.Unlock()
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := relay.Read(buf)
			if err != nil {
				return // the host left; the guest is not told
			}
			if _, err := p.pw.Write(buf[:n]); err != nil {
				return
			}
		}
	}()
	return host
}

func (p *relayPort) Read(b []byte) (int, error) { return p.pr.Read(b) }

func (p *relayPort) Write(b []byte) (int, error) {
	p.mu.Lock()
	c := p.cur
	p.mu.Unlock()
	_, _ = c.Write(b)
	return len(b), nil
}

func (p *relayPort) Close() error {
	_ = p.pr.Close()
	return nil
}

// TestSessionSurvivesStaleBytes: a restored guest still holds half a message
// of the old host and never saw it leave; a new host's session works anyway,
// the old session ends, and its late replies do not reach the new host.
func TestSessionSurvivesStaleBytes(t *testing.T) {
	port := newRelayPort()
	l := ListenSerial(port)
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	oldHost, guestOld := sessionPair(t, ctx, l, port.attach())
	var half bytes.Buffer
	_ = newFrameWriter(&half).writeFrame(frame{typ: frameData, session: oldHost.(*sessionConn).id, payload: []byte("stale request")})
	if _, err := port.pw.Write(half.Bytes()[:10]); err != nil {
		t.Fatal(err)
	}

	newHost, newGuest := sessionPair(t, ctx, l, port.attach())
	if _, err := io.ReadAll(guestOld); err != nil {
		t.Errorf("old session: %v, want it ended", err)
	}
	if _, err := guestOld.Write([]byte("late reply")); err != nil {
		t.Fatal(err)
	}
	echo(t, newHost, newGuest, "hello")
	echo(t, newGuest, newHost, "world")
}

func sessionPair(t *testing.T, ctx context.Context, l *SerialListener, hostEnd net.Conn) (host, guest net.Conn) {
	t.Helper()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		accepted <- c
	}()
	host, err := openSession(ctx, hostEnd)
	if err != nil {
		t.Fatal(err)
	}
	return host, <-accepted
}

func echo(t *testing.T, from, to net.Conn, msg string) {
	t.Helper()
	go func() { _, _ = from.Write([]byte(msg)) }()
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(to, buf); err != nil || string(buf) != msg {
		t.Errorf("read %q %v, want %q", buf, err, msg)
	}
}
