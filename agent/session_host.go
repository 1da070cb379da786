package agent

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"time"
)

const (
	// synInterval is how often the host repeats its SYN until the guest
	// answers: a SYN sent before the agent opened its port is lost.
	synInterval = 50 * time.Millisecond
	// finTimeout bounds the FIN of a closing session, and with it a write
	// in progress to a guest that stopped reading.
	finTimeout = 100 * time.Millisecond
)

// eagerKey marks a context for Eager.
type eagerKey struct{}

// Eager returns a context on which DialUnix returns its session without
// waiting for the guest agent to accept it: what the caller writes follows
// the SYN at once, sparing the guest a round trip. It is for a guest whose
// agent serves already, a restored snapshot's: a SYN that an agent not yet
// listening missed would take those bytes with it (the SYN is sent again,
// the bytes are not). Client.Accepted waits for the acceptance.
func Eager(ctx context.Context) context.Context {
	return context.WithValue(ctx, eagerKey{}, true)
}

// accepted waits until the guest agent accepted conn's session: at once for
// a stream without sessions or a session whose dial waited for it.
func accepted(ctx context.Context, conn net.Conn) error {
	e, ok := conn.(*eagerSession)
	if !ok {
		return nil
	}
	select {
	case err := <-e.acked:
		e.acked <- err // for the next caller
		if err != nil {
			return fmt.Errorf("guest agent stream ended before it answered: %w", err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for guest agent: %w", ctx.Err())
	}
}

// eagerSession is a session returned before the agent accepted it.
type eagerSession struct {
	*sessionConn
	acked chan error // holds the acceptance's result once known
}

// openSession starts a session over conn, the host end of the guest's
// virtio-serial port, and returns it once the guest agent acknowledged it,
// or at once on an Eager ctx. Frames of any earlier session still in the
// stream are ignored.
func openSession(ctx context.Context, conn net.Conn) (net.Conn, error) {
	id, err := newSessionID()
	if err != nil {
		return nil, err
	}
	w := newFrameWriter(conn)
	s := newSessionConn(id, w, func() {
		_ = conn.SetWriteDeadline(time.Now().Add(finTimeout))
		_ = w.writeFrame(frame{typ: frameFin, session: id})
		_ = conn.Close()
	})
	acked := make(chan error, 1)
	go hostReadLoop(newFrameReader(conn), s, acked)
	if eager, _ := ctx.Value(eagerKey{}).(bool); eager {
		return openEager(ctx, conn, w, s, acked)
	}
	// A write blocks while nobody reads the socket (QEMU serves one host at
	// a time), so ctx must end writes too.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetWriteDeadline(time.Now()) })
	defer stop()

	if err := w.writeDelimiter(); err != nil {
		_ = conn.Close()
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("write to guest agent: %w", err)
	}
	tick := time.NewTicker(synInterval)
	defer tick.Stop()
	for {
		if err := w.writeFrame(frame{typ: frameSyn, session: id}); err != nil {
			_ = conn.Close()
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return nil, fmt.Errorf("write to guest agent: %w", err)
		}
		select {
		case err := <-acked:
			if !stop() {
				err = errors.Join(err, ctx.Err())
			}
			if err != nil {
				_ = conn.Close()
				return nil, fmt.Errorf("guest agent stream ended before it answered: %w", err)
			}
			return s, nil
		case <-ctx.Done():
			_ = conn.Close()
			return nil, fmt.Errorf("wait for guest agent: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// openEager sends the SYN and returns s; the SYN is sent again until the
// agent acknowledges it or ctx ends, in the background.
func openEager(ctx context.Context, conn net.Conn, w *frameWriter, s *sessionConn, acked chan error) (net.Conn, error) {
	syn := frame{typ: frameSyn, session: s.id}
	if err := errors.Join(w.writeDelimiter(), w.writeFrame(syn)); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("write to guest agent: %w", err)
	}
	e := &eagerSession{sessionConn: s, acked: make(chan error, 1)}
	go func() {
		tick := time.NewTicker(synInterval)
		defer tick.Stop()
		for {
			select {
			case err := <-acked:
				e.acked <- err
				return
			case <-ctx.Done():
				e.acked <- ctx.Err()
				return
			case <-tick.C:
				_ = w.writeFrame(syn)
			}
		}
	}()
	return e, nil
}

// hostReadLoop feeds the session's DATA frames to s and reports the ACK.
func hostReadLoop(r *frameReader, s *sessionConn, acked chan<- error) {
	open := false
	for {
		f, err := r.readFrame()
		if err != nil {
			if !open {
				acked <- err
			}
			_ = s.pw.CloseWithError(err)
			return
		}
		if f.session != s.id {
			continue
		}
		switch {
		case f.typ == frameAck && !open:
			open = true
			acked <- nil
		case f.typ == frameData && open:
			s.deliver(f.payload)
		}
	}
}

func newSessionID() (uint64, error) {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			return 0, fmt.Errorf("make session id: %w", err)
		}
		if id := binary.BigEndian.Uint64(b[:]); id != 0 {
			return id, nil
		}
	}
}
