package agent

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"sync"
)

const (
	// maxQueued bounds what the host holds for a guest that does not read
	// its port; past it the connection fails. Every call waits for its
	// reply, so only concurrent calls queue: Init's bounded files and 32 KiB
	// stdin chunks fit many times over.
	maxQueued = 16 << 20
)

var errGuestNotReading = errors.New("guest agent is not reading its port")

// sendQueue hands the client's writes to the guest from its own goroutine.
// A guest that stops reading its port then blocks no caller: a call waits
// only for its reply, under its own context, and Close returns at once. A
// call that gives up may still reach the guest later, as any request whose
// deadline passes after it was sent.
type sendQueue struct {
	net.Conn

	mu      sync.Mutex
	cond    *sync.Cond
	queue   [][]byte
	queued  int
	closing bool
	err     error // set once writing failed; later writes return it
}

func newSendQueue(conn net.Conn) *sendQueue {
	q := &sendQueue{Conn: conn}
	q.cond = sync.NewCond(&q.mu)
	go q.run()
	return q
}

// Write queues a copy of p; it fails once the connection failed, was
// closed, or the guest left maxQueued bytes unread.
func (q *sendQueue) Write(p []byte) (int, error) {
	q.mu.Lock()
	switch {
	case q.err != nil:
		defer q.mu.Unlock()
		return 0, q.err
	case q.closing:
		defer q.mu.Unlock()
		return 0, net.ErrClosed
	case q.queued+len(p) > maxQueued:
		err := fmt.Errorf("%d bytes unread: %w", q.queued, errGuestNotReading)
		q.err = err
		q.cond.Signal()
		q.mu.Unlock()
		// The connection is dead: end the write in progress and every read.
		_ = q.Conn.Close()
		return 0, err
	}
	q.queue = append(q.queue, bytes.Clone(p))
	q.queued += len(p)
	q.cond.Signal()
	q.mu.Unlock()
	return len(p), nil
}

// Close closes the connection at once, cutting off a write in progress:
// every call waits for its reply, so what is still queued or being written
// belongs to calls that gave up, and a closing client wants no replies.
// It never waits for the guest to read.
func (q *sendQueue) Close() error {
	q.mu.Lock()
	if q.closing {
		q.mu.Unlock()
		return nil
	}
	q.closing = true
	q.queue, q.queued = nil, 0
	q.cond.Signal()
	q.mu.Unlock()
	return q.Conn.Close()
}

func (q *sendQueue) run() {
	defer q.Conn.Close()
	for {
		b, ok := q.next()
		if !ok {
			return
		}
		_, err := q.Conn.Write(b)
		q.mu.Lock()
		q.queued -= len(b)
		if err != nil && q.err == nil {
			q.err = fmt.Errorf("write to guest agent: %w", err)
		}
		failed := q.err != nil
		q.mu.Unlock()
		if failed {
			return
		}
	}
}

// next waits for the next write; false once closed and flushed, or failed.
func (q *sendQueue) next() ([]byte, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.queue) == 0 && !q.closing && q.err == nil {
		q.cond.Wait()
	}
	if q.err != nil || len(q.queue) == 0 {
		return nil, false
	}
	b := q.queue[0]
	q.queue[0] = nil
	q.queue = q.queue[1:]
	return b, true
}
