package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const greeting = `{"QMP": {"version": {"qemu": {"micro": 22, "minor": 2, "major": 7}}, "capabilities": ["oob"]}}`

// fakeQMP is the QEMU end of a QMP connection, scripted by a test.
type fakeQMP struct {
	t    *testing.T
	conn net.Conn
	r    *bufio.Reader
}

func newFakeQMP(t *testing.T) (*fakeQMP, net.Conn) {
	server, client := net.Pipe()
	t.Cleanup(func() { server.Close(); client.Close() })
	return &fakeQMP{t: t, conn: server, r: bufio.NewReader(server)}, client
}

// dialFakeUnix is dialFake over a unix socket pair, which can pass files.
func dialFakeUnix(t *testing.T) (*fakeQMP, *qmp) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "qmp")
		conns[i], err = net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	server, client := conns[0], conns[1]
	t.Cleanup(func() { server.Close(); client.Close() })
	f := &fakeQMP{t: t, conn: server, r: bufio.NewReader(server)}
	go f.handshake()
	q, err := newQMP(context.Background(), client)
	if err != nil {
		t.Fatalf("newQMP: %v", err)
	}
	t.Cleanup(func() { q.Close() })
	return f, q
}

func (f *fakeQMP) send(line string) {
	if _, err := f.conn.Write([]byte(line + "\n")); err != nil {
		f.t.Errorf("fake qmp write: %v", err)
	}
}

// recv reads one command and returns its name and id.
func (f *fakeQMP) recv() (execute, id string, args json.RawMessage) {
	line, err := f.r.ReadBytes('\n')
	if err != nil {
		f.t.Errorf("fake qmp read: %v", err)
		return "", "", nil
	}
	var c struct {
		Execute   string          `json:"execute"`
		ID        string          `json:"id"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := json.Unmarshal(line, &c); err != nil {
		f.t.Errorf("fake qmp got %q: %v", line, err)
	}
	return c.Execute, c.ID, c.Arguments
}

// handshake plays QEMU's side of connecting.
func (f *fakeQMP) handshake() {
	f.send(greeting)
	if cmd, id, _ := f.recv(); cmd == "qmp_capabilities" {
		f.send(`{"return": {}, "id": "` + id + `"}`)
	} else {
		f.t.Errorf("first command %q, want qmp_capabilities", cmd)
	}
}

func dialFake(t *testing.T) (*fakeQMP, *qmp) {
	t.Helper()
	f, client := newFakeQMP(t)
	go f.handshake()
	q, err := newQMP(context.Background(), client)
	if err != nil {
		t.Fatalf("newQMP: %v", err)
	}
	t.Cleanup(func() { q.Close() })
	return f, q
}

func TestQMPReplyMatchedAcrossEvents(t *testing.T) {
	f, q := dialFake(t)
	go func() {
		cmd, id, args := f.recv()
		if cmd != "query-status" || args != nil {
			t.Errorf("got %q args %s, want query-status without arguments", cmd, args)
		}
		f.send(`{"timestamp": {"seconds": 1, "microseconds": 2}, "event": "STOP"}`)
		f.send(`{"return": {"status": "other"}, "id": "unrelated"}`)
		f.send(`{"return": {"status": "paused", "running": false}, "id": "` + id + `"}`)
	}()
	var st struct {
		Status  string `json:"status"`
		Running bool   `json:"running"`
	}
	if err := q.Execute(context.Background(), "query-status", nil, &st); err != nil {
		t.Fatal(err)
	}
	if st.Status != "paused" || st.Running {
		t.Fatalf("status %+v, want paused and not running", st)
	}
}

func TestQMPErrorReply(t *testing.T) {
	f, q := dialFake(t)
	go func() {
		_, id, _ := f.recv()
		f.send(`{"error": {"class": "GenericError", "desc": "There is no migration in progress"}, "id": "` + id + `"}`)
	}()
	err := q.Execute(context.Background(), "migrate_cancel", nil, nil)
	var qerr *QMPError
	if !errors.As(err, &qerr) || qerr.Class != "GenericError" {
		t.Fatalf("err %v, want a GenericError QMPError", err)
	}
	if !strings.Contains(err.Error(), "migrate_cancel") {
		t.Fatalf("err %q does not name the command", err)
	}
}

func TestQMPArgumentsEncoded(t *testing.T) {
	f, q := dialFake(t)
	got := make(chan string, 1)
	go func() {
		_, id, args := f.recv()
		got <- string(args)
		f.send(`{"return": {}, "id": "` + id + `"}`)
	}()
	if err := q.Execute(context.Background(), "migrate", map[string]string{"uri": "fd:<m>"}, nil); err != nil {
		t.Fatal(err)
	}
	if want := `{"uri":"fd:\u003cm\u003e"}`; <-got != want {
		t.Fatalf("arguments differ, want %s", want)
	}
}

func TestQMPEventWaiters(t *testing.T) {
	f, q := dialFake(t)
	completed, cancelCompleted := q.Expect(func(ev Event) bool {
		return ev.Name == "MIGRATION" && migrationFinished(ev.Data) != ""
	})
	defer cancelCompleted()
	stop, cancelStop := q.Expect(func(ev Event) bool { return ev.Name == "STOP" })
	defer cancelStop()
	go func() {
		f.send(`{"event": "MIGRATION", "data": {"status": "setup"}}`)
		f.send(`{"event": "STOP"}`)
		f.send(`{"event": "MIGRATION", "data": {"status": "active"}}`)
		f.send(`{"event": "MIGRATION", "data": {"status": "completed"}}`)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ev, err := completed(ctx)
	if err != nil || migrationFinished(ev.Data) != "completed" {
		t.Fatalf("migration event %+v, %v; want completed", ev, err)
	}
	if ev, err := stop(ctx); err != nil || ev.Name != "STOP" {
		t.Fatalf("stop event %+v, %v", ev, err)
	}
}

func TestQMPClosedWakesWaiters(t *testing.T) {
	f, q := dialFake(t)
	wait, cancelWait := q.Expect(func(ev Event) bool { return ev.Name == "SHUTDOWN" })
	defer cancelWait()
	go func() {
		f.recv()
		f.conn.Close()
	}()
	if err := q.Execute(context.Background(), "stop", nil, nil); !errors.Is(err, errQMPClosed) {
		t.Fatalf("execute on a closed connection: %v, want errQMPClosed", err)
	}
	if _, err := wait(context.Background()); !errors.Is(err, errQMPClosed) {
		t.Fatalf("event wait on a closed connection: %v, want errQMPClosed", err)
	}
}

// An event dispatched just before the connection closed is delivered, not
// lost to the close: every waiter for it gets it even when it waits after
// the close.
func TestQMPEventBeforeClose(t *testing.T) {
	f, q := dialFake(t)
	const waiters = 32
	var waits []func(context.Context) (Event, error)
	for range waiters {
		wait, cancel := q.Expect(func(ev Event) bool { return ev.Name == "SHUTDOWN" })
		t.Cleanup(cancel)
		waits = append(waits, wait)
	}
	go func() {
		f.send(`{"event": "SHUTDOWN"}`)
		f.conn.Close()
	}()
	<-q.done
	for i, wait := range waits {
		if ev, err := wait(context.Background()); err != nil || ev.Name != "SHUTDOWN" {
			t.Fatalf("waiter %d: event %+v, %v; want the SHUTDOWN sent before the close", i, ev, err)
		}
	}
}

// waiters counts the event waiters registered on q.
func waiters(q *qmp) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.waits)
}

func TestQMPExpectCancel(t *testing.T) {
	_, q := dialFake(t)
	_, cancel := q.Expect(func(Event) bool { return true })
	if n := waiters(q); n != 1 {
		t.Fatalf("%d waiters after Expect, want 1", n)
	}
	cancel()
	cancel()
	if n := waiters(q); n != 0 {
		t.Fatalf("%d waiters after cancel, want 0", n)
	}
}

// A migration QEMU refuses to start leaves no event waiter behind.
func TestMigrateRefusedDropsWaiter(t *testing.T) {
	f, q := dialFakeUnix(t)
	go func() {
		for _, want := range []string{"migrate-set-capabilities", "getfd"} {
			if cmd, id, _ := f.recv(); cmd == want {
				f.send(`{"return": {}, "id": "` + id + `"}`)
			} else {
				t.Errorf("command %q, want %s", cmd, want)
			}
		}
		_, id, _ := f.recv()
		f.send(`{"error": {"class": "GenericError", "desc": "refused"}, "id": "` + id + `"}`)
	}()
	state, err := os.Create(t.TempDir() + "/state")
	if err != nil {
		t.Fatal(err)
	}
	defer state.Close()
	v := &VM{qmp: q}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := v.migrate(ctx, "migrate", state); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("migrate: %v, want QEMU's refusal", err)
	}
	if n := waiters(q); n != 0 {
		t.Fatalf("%d event waiters left after a refused migration, want 0", n)
	}
}

func TestQMPHandshakeFailures(t *testing.T) {
	tests := []struct {
		name  string
		serve func(f *fakeQMP)
		want  string
	}{
		{"silent", func(f *fakeQMP) {}, "wait for qmp greeting"},
		{"not qmp", func(f *fakeQMP) { f.send(`{"event": "STOP"}`) }, "want a QMP greeting"},
		{"garbage", func(f *fakeQMP) { f.send(`hello`) }, "decode qmp message"},
		{"capabilities refused", func(f *fakeQMP) {
			f.send(greeting)
			_, id, _ := f.recv()
			f.send(`{"error": {"class": "CommandNotFound", "desc": "no"}, "id": "` + id + `"}`)
		}, "qmp qmp_capabilities: CommandNotFound"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, client := newFakeQMP(t)
			go tt.serve(f)
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			_, err := newQMP(ctx, client)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestMigrationFinished(t *testing.T) {
	for data, want := range map[string]string{
		`{"status":"completed"}`: "completed",
		`{"status":"failed"}`:    "failed",
		`{"status":"cancelled"}`: "cancelled",
		`{"status":"active"}`:    "",
		`{"status":"setup"}`:     "",
		`not json`:               "",
	} {
		if got := migrationFinished(json.RawMessage(data)); got != want {
			t.Errorf("migrationFinished(%s) = %q, want %q", data, got, want)
		}
	}
}
