package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

var noDeadline time.Time

// qmpMessage is any message QEMU sends on a QMP socket: the greeting, a
// command's reply (matched by id) or an asynchronous event.
type qmpMessage struct {
	QMP    json.RawMessage `json:"QMP,omitempty"`
	ID     string          `json:"id,omitempty"`
	Return json.RawMessage `json:"return,omitempty"`
	Error  *QMPError       `json:"error,omitempty"`
	Event  string          `json:"event,omitempty"`
	Data   json.RawMessage `json:"data,omitempty"`
	// Timestamp is when QEMU emitted an event.
	Timestamp struct {
		Seconds      int64 `json:"seconds"`
		Microseconds int64 `json:"microseconds"`
	} `json:"timestamp"`
}

// QMPError is an error reply to a QMP command.
type QMPError struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *QMPError) Error() string { return e.Class + ": " + e.Desc }

// Event is an asynchronous QMP event such as MIGRATION, STOP or SHUTDOWN.
type Event struct {
	Name string
	Data json.RawMessage
	// At is when QEMU emitted it.
	At time.Time
}

// errQMPClosed is returned to every waiter once the connection is gone,
// which is also how a dead QEMU process shows up.
var errQMPClosed = errors.New("qmp connection closed")

// qmp is a QMP client. Commands carry ids so replies can be matched while
// events arrive interleaved; events go to the waiters registered for them.
type qmp struct {
	conn  net.Conn
	wmu   sync.Mutex
	mu    sync.Mutex
	reply map[string]chan qmpMessage
	waits map[*eventWait]struct{}
	next  atomic.Uint64
	done  chan struct{}
	err   error
}

type eventWait struct {
	match func(Event) bool
	ch    chan Event
}

// newQMP takes over conn: it reads the greeting, negotiates capabilities and
// starts the reader. ctx bounds the handshake; a QEMU that never greets
// fails here when ctx ends.
func newQMP(ctx context.Context, conn net.Conn) (*qmp, error) {
	r := bufio.NewReader(conn)
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	greeting, err := readMessage(r)
	if !stop() {
		conn.Close()
		return nil, fmt.Errorf("wait for qmp greeting: %w", context.Cause(ctx))
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("read qmp greeting: %w", err)
	}
	if greeting.QMP == nil {
		conn.Close()
		return nil, fmt.Errorf("read qmp greeting: got %q, want a QMP greeting", greeting.Event)
	}
	c := &qmp{
		conn:  conn,
		reply: map[string]chan qmpMessage{},
		waits: map[*eventWait]struct{}{},
		done:  make(chan struct{}),
	}
	go c.readLoop(r)
	if err := c.Execute(ctx, "qmp_capabilities", nil, nil); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func readMessage(r *bufio.Reader) (qmpMessage, error) {
	line, err := r.ReadBytes('\n')
	if err != nil {
		return qmpMessage{}, err
	}
	var m qmpMessage
	if err := json.Unmarshal(line, &m); err != nil {
		return qmpMessage{}, fmt.Errorf("decode qmp message %q: %w", line, err)
	}
	return m, nil
}

func (c *qmp) readLoop(r *bufio.Reader) {
	var err error
	for {
		var m qmpMessage
		if m, err = readMessage(r); err != nil {
			break
		}
		c.dispatch(m)
	}
	c.mu.Lock()
	c.err = fmt.Errorf("%w: %v", errQMPClosed, err)
	c.mu.Unlock()
	close(c.done)
}

func (c *qmp) dispatch(m qmpMessage) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m.Event != "" {
		ev := Event{Name: m.Event, Data: m.Data, At: time.Unix(m.Timestamp.Seconds, m.Timestamp.Microseconds*1000)}
		for w := range c.waits {
			if w.match(ev) {
				delete(c.waits, w)
				w.ch <- ev
			}
		}
		return
	}
	if ch, ok := c.reply[m.ID]; ok {
		delete(c.reply, m.ID)
		ch <- m
	}
}

// closedErr is why the connection ended; valid once done is closed.
func (c *qmp) closedErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Execute runs command with args (nil for none) and decodes the reply's
// return value into out (nil to ignore it).
func (c *qmp) Execute(ctx context.Context, command string, args, out any) error {
	return c.execute(ctx, command, args, out, nil)
}

// SendFile passes f to QEMU under name (QMP getfd, SCM_RIGHTS), for URIs
// such as fd:name. QEMU holds its own duplicate; the caller keeps f.
func (c *qmp) SendFile(ctx context.Context, name string, f *os.File) error {
	return c.execute(ctx, "getfd", map[string]string{"fdname": name}, nil, f)
}

func (c *qmp) execute(ctx context.Context, command string, args, out any, f *os.File) error {
	id := strconv.FormatUint(c.next.Add(1), 10)
	req, err := json.Marshal(struct {
		Execute   string `json:"execute"`
		Arguments any    `json:"arguments,omitempty"`
		ID        string `json:"id"`
	}{command, args, id})
	if err != nil {
		return fmt.Errorf("encode qmp %s: %w", command, err)
	}
	ch := make(chan qmpMessage, 1)
	c.mu.Lock()
	c.reply[id] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.reply, id)
		c.mu.Unlock()
	}()
	if err := c.write(ctx, append(req, '\n'), f); err != nil {
		return fmt.Errorf("qmp %s: %w", command, err)
	}
	select {
	case m := <-ch:
		return decodeReply(command, m, out)
	case <-c.done:
		// A reply that raced the close (quit does this) still counts.
		select {
		case m := <-ch:
			return decodeReply(command, m, out)
		default:
			return fmt.Errorf("qmp %s: %w", command, c.closedErr())
		}
	case <-ctx.Done():
		return fmt.Errorf("qmp %s: %w", command, context.Cause(ctx))
	}
}

func (c *qmp) write(ctx context.Context, b []byte, f *os.File) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if d, ok := ctx.Deadline(); ok {
		c.conn.SetWriteDeadline(d)
		defer c.conn.SetWriteDeadline(noDeadline)
	}
	if f == nil {
		_, err := c.conn.Write(b)
		return err
	}
	uc, ok := c.conn.(*net.UnixConn)
	if !ok {
		return fmt.Errorf("pass a file: qmp is not on a unix socket")
	}
	_, _, err := uc.WriteMsgUnix(b, unix.UnixRights(int(f.Fd())), nil)
	return err
}

func decodeReply(command string, m qmpMessage, out any) error {
	if m.Error != nil {
		return fmt.Errorf("qmp %s: %w", command, m.Error)
	}
	if out == nil || m.Return == nil {
		return nil
	}
	if err := json.Unmarshal(m.Return, out); err != nil {
		return fmt.Errorf("decode qmp %s reply: %w", command, err)
	}
	return nil
}

// Expect registers interest in the first event that match accepts. Register
// before the command that causes the event so it cannot be missed; wait
// waits for it. Call cancel (defer it) when the event is no longer wanted,
// such as when the command failed and wait is never called: it unregisters
// the waiter, which would otherwise stay for the connection's life.
func (c *qmp) Expect(match func(Event) bool) (wait func(ctx context.Context) (Event, error), cancel func()) {
	w := &eventWait{match: match, ch: make(chan Event, 1)}
	c.mu.Lock()
	c.waits[w] = struct{}{}
	c.mu.Unlock()
	cancel = func() {
		c.mu.Lock()
		delete(c.waits, w)
		c.mu.Unlock()
	}
	wait = func(ctx context.Context) (Event, error) {
		defer cancel()
		select {
		case ev := <-w.ch:
			return ev, nil
		case <-c.done:
			// An event dispatched just before the close still counts.
			select {
			case ev := <-w.ch:
				return ev, nil
			default:
				return Event{}, c.closedErr()
			}
		case <-ctx.Done():
			return Event{}, context.Cause(ctx)
		}
	}
	return wait, cancel
}

// Close ends the connection; waiters get errQMPClosed.
func (c *qmp) Close() error {
	return c.conn.Close()
}
