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

	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/proto"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// FuzzFrameReader feeds any bytes to the frame reader: it never fails but
// at the end of the stream, and every frame it returns is well formed and
// survives another round trip.
func FuzzFrameReader(f *testing.F) {
	var valid bytes.Buffer
	w := newFrameWriter(&valid)
	_ = w.writeFrame(frame{typ: frameSyn, session: 1})
	_ = w.writeFrame(frame{typ: frameData, session: 1, payload: []byte{frameEnd, frameEsc, 0}})
	f.Add(valid.Bytes())
	f.Add(valid.Bytes()[:valid.Len()/2])
	f.Add([]byte{frameEnd, frameEsc, frameEnd, frameEsc, frameEscEnd, frameEnd})
	f.Add(bytes.Repeat([]byte{'a'}, maxFrameLen+2))
	f.Add(append([]byte("noise"), valid.Bytes()...))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := newFrameReader(bytes.NewReader(b))
		var again bytes.Buffer
		aw, ar := newFrameWriter(&again), newFrameReader(&again)
		for {
			fr, err := r.readFrame()
			if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				t.Fatalf("read: %v, want only io.EOF", err)
			}
			if fr.typ < frameSyn || fr.typ > frameFin || len(fr.payload) > maxFramePayload {
				t.Fatalf("returned a frame of type %d with %d bytes", fr.typ, len(fr.payload))
			}
			if err := aw.writeFrame(fr); err != nil {
				t.Fatal(err)
			}
			got, err := ar.readFrame()
			if err != nil || got.typ != fr.typ || got.session != fr.session || !bytes.Equal(got.payload, fr.payload) {
				t.Fatalf("round trip of %v/%d/%q: %v/%d/%q %v", fr.typ, fr.session, fr.payload, got.typ, got.session, got.payload, err)
			}
		}
	})
}

// fuzzCalls is how many calls the host has in flight when the guest
// answers.
const fuzzCalls = 5

// FuzzHostSession is a hostile guest: once the host has fuzzCalls calls in
// flight, the guest sends the input (as the session's data when its first
// byte is even, else raw onto the port) and hangs up. Every call returns,
// nothing panics, and the host's log stays short.
func FuzzHostSession(f *testing.F) {
	reply := func(stream uint32, m proto.Message) []byte {
		payload, _ := proto.Marshal(m)
		b, _ := proto.Marshal(&ttrpc.Response{Payload: payload})
		return appendTTRPC(nil, stream, ttrpcTypeResponse, b)
	}
	var all []byte
	for s := uint32(1); s < 2*fuzzCalls; s += 2 {
		all = append(all, reply(s, &api.ExecResponse{Pid: 7})...)
	}
	f.Add(append([]byte{0}, reply(1, &api.PingResponse{Version: "1"})...))
	f.Add(append([]byte{0}, all...))
	f.Add(append([]byte{0}, appendTTRPC(nil, 1, ttrpcTypeResponse, []byte{0xff, 0xff, 0xff})...))
	f.Add(append([]byte{0}, appendTTRPC(nil, 3, 3, []byte("data"))...))
	f.Add(append([]byte{0}, []byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1, 2, 0}...))
	f.Add(append([]byte{1}, frameEnd, frameEsc, 'x', frameEnd))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) == 0 {
			return
		}
		lines := captureLog(t)
		host, guest := net.Pipe()
		go fuzzGuest(guest, b[0]%2 == 0, b[1:])
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn, err := openSession(ctx, host)
		if err != nil {
			t.Fatalf("open session: %v", err)
		}
		c := NewClient(conn)
		if err := returnsIn(watchdog, func() error { hostileCalls(ctx, c); return nil }); err != nil {
			t.Fatalf("calls: %v", err)
		}
		if err := returnsIn(watchdog, c.Close); err != nil {
			t.Fatalf("close: %v", err)
		}
		if n := lines(); n > 2*fuzzCalls+40 {
			t.Errorf("%d bytes from the guest logged %d lines", len(b), n)
		}
	})
}

// hostileCalls makes fuzzCalls calls at once, then reads the output of
// the process if Exec succeeded.
func hostileCalls(ctx context.Context, c *Client) {
	var wg sync.WaitGroup
	var proc *Process
	calls := []func(){
		func() { _ = c.Ping(ctx) },
		func() { proc, _ = c.Exec(ctx, ExecRequest{ID: "p", Args: []string{"sh"}}) },
		func() { _, _ = c.Wait(ctx, "p") },
		func() { _, _ = c.Stats(ctx) },
		func() { _, _ = c.Processes(ctx) },
	}
	for _, call := range calls {
		wg.Go(call)
	}
	wg.Wait()
	if proc != nil {
		_, out, _ := proc.Stdio()
		_, _ = io.Copy(io.Discard, out)
	}
}

// fuzzGuest acknowledges the host's session, waits for fuzzCalls requests,
// sends input and hangs up.
func fuzzGuest(conn net.Conn, framed bool, input []byte) {
	defer conn.Close()
	r, w := newFrameReader(conn), newFrameWriter(conn)
	var session uint64
	for {
		f, err := r.readFrame()
		if err != nil {
			return
		}
		if f.typ == frameSyn {
			session = f.session
			break
		}
	}
	if w.writeFrame(frame{typ: frameAck, session: session}) != nil {
		return
	}
	seen := make(chan struct{})
	go countRequests(r, session, seen)
	select {
	case <-seen:
	case <-time.After(watchdog):
		return
	}
	if !framed {
		_, _ = conn.Write(input)
		return
	}
	for len(input) > 0 {
		n := min(len(input), maxFramePayload)
		if w.writeFrame(frame{typ: frameData, session: session, payload: input[:n]}) != nil {
			return
		}
		input = input[n:]
	}
}

// countRequests reads the host's frames, closing seen at the fuzzCalls-th
// request, until the connection ends.
func countRequests(r *frameReader, session uint64, seen chan<- struct{}) {
	var scan headerScanner
	n := 0
	for {
		f, err := r.readFrame()
		if err != nil {
			return
		}
		if f.typ != frameData || f.session != session {
			continue
		}
		scan.scan(f.payload, func(h ttrpcHeader) {
			if h.typ == ttrpcTypeRequest {
				if n++; n == fuzzCalls {
					close(seen)
				}
			}
		})
	}
}
