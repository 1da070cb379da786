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

// openSession starts a session over conn, the host end of the guest's
// virtio-serial port, and returns it once the guest agent acknowledged it.
// Frames of any earlier session still in the stream are ignored.
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
