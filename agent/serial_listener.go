package agent

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
)

// SerialListener accepts host sessions on the guest end of a virtio-serial
// port. The port is one stream shared by every host that ever connects (a
// restored clone talks to a new host over the same port), so it hands out a
// new net.Conn for each host SYN and ends the previous one: its in-flight
// calls fail and whatever it left half-sent is dropped.
//
// port.Read must return io.EOF when the host goes away and then block until
// the next host connects.
type SerialListener struct {
	port  io.ReadWriteCloser
	w     *frameWriter
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once

	mu  sync.Mutex
	cur *sessionConn
	err error
}

// ListenSerial serves sessions on port until Close.
func ListenSerial(port io.ReadWriteCloser) *SerialListener {
	l := &SerialListener{
		port:  port,
		w:     newFrameWriter(port),
		conns: make(chan net.Conn),
		done:  make(chan struct{}),
	}
	go l.readLoop()
	return l
}

// Accept returns the next host session.
func (l *SerialListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		l.mu.Lock()
		defer l.mu.Unlock()
		return nil, l.err
	}
}

// Close stops the listener, ends the current session and closes the port.
func (l *SerialListener) Close() error {
	l.shut(net.ErrClosed)
	return nil
}

// Addr names the listener.
func (l *SerialListener) Addr() net.Addr { return sessionAddr(0) }

func (l *SerialListener) shut(err error) {
	l.once.Do(func() {
		l.mu.Lock()
		l.err = err
		l.mu.Unlock()
		close(l.done)
		l.endSession()
		_ = l.port.Close()
	})
}

func (l *SerialListener) readLoop() {
	r := newFrameReader(l.port)
	for {
		f, err := r.readFrame()
		if errors.Is(err, io.EOF) {
			l.endSession() // the host went away; the next one sends a SYN
			continue
		}
		if err != nil {
			l.shut(fmt.Errorf("read agent port: %w", err))
			return
		}
		switch f.typ {
		case frameSyn:
			l.startSession(f.session)
		case frameData:
			if c := l.session(f.session); c != nil {
				c.deliver(f.payload)
			}
		case frameFin:
			if c := l.session(f.session); c != nil {
				l.endSession()
			}
		}
	}
}

func (l *SerialListener) session(id uint64) *sessionConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cur != nil && l.cur.id == id {
		return l.cur
	}
	return nil
}

func (l *SerialListener) endSession() {
	l.mu.Lock()
	c := l.cur
	l.cur = nil
	l.mu.Unlock()
	if c != nil {
		c.end()
	}
}

// startSession acknowledges a SYN; a repeated SYN of the current session is
// only acknowledged again.
func (l *SerialListener) startSession(id uint64) {
	if l.session(id) == nil {
		l.endSession()
		c := newSessionConn(id, l.w, nil)
		select {
		case l.conns <- c:
		case <-l.done:
			return
		}
		l.mu.Lock()
		l.cur = c
		l.mu.Unlock()
	}
	_ = l.w.writeFrame(frame{typ: frameAck, session: id})
}
