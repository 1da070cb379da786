package vmtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"testing"
	"time"
)

// qmpTimeout bounds each QMP exchange.
const qmpTimeout = 60 * time.Second

// qmp is a minimal QMP client: commands, and waiting for MIGRATION events.
type qmp struct {
	conn net.Conn
	dec  *json.Decoder
	enc  *json.Encoder
}

type qmpMessage struct {
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
	Event string `json:"event"`
	Data  struct {
		Status string `json:"status"`
	} `json:"data"`
}

// dialQMP connects to path (QEMU creates it shortly after start) and
// negotiates capabilities.
func dialQMP(ctx context.Context, path string) (*qmp, error) {
	var d net.Dialer
	for {
		conn, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			q := &qmp{conn: conn, dec: json.NewDecoder(conn), enc: json.NewEncoder(conn)}
			var greeting json.RawMessage
			if err := q.dec.Decode(&greeting); err != nil {
				conn.Close()
				return nil, fmt.Errorf("read qmp greeting: %w", err)
			}
			return q, q.execute("qmp_capabilities", nil)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("dial qmp: %w (last: %v)", ctx.Err(), err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (q *qmp) execute(cmd string, args any) error {
	_ = q.conn.SetDeadline(time.Now().Add(qmpTimeout))
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	if err := q.enc.Encode(req); err != nil {
		return fmt.Errorf("qmp %s: %w", cmd, err)
	}
	for {
		var m qmpMessage
		if err := q.dec.Decode(&m); err != nil {
			return fmt.Errorf("qmp %s: %w", cmd, err)
		}
		if m.Error != nil {
			return fmt.Errorf("qmp %s: %s: %s", cmd, m.Error.Class, m.Error.Desc)
		}
		if m.Return != nil {
			return nil
		}
	}
}

// waitMigration waits for the MIGRATION event reporting completed.
func (q *qmp) waitMigration() error {
	_ = q.conn.SetDeadline(time.Now().Add(qmpTimeout))
	for {
		var m qmpMessage
		if err := q.dec.Decode(&m); err != nil {
			return fmt.Errorf("wait for migration: %w", err)
		}
		if m.Event != "MIGRATION" {
			continue
		}
		switch m.Data.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s", m.Data.Status)
		}
	}
}

var migrationCaps = map[string]any{"capabilities": []map[string]any{
	{"capability": "x-ignore-shared", "state": true},
	{"capability": "events", "state": true},
}}

// Snapshot pauses vm and writes its device state to stateFile; guest RAM
// stays in the memory file (x-ignore-shared).
func (vm *VM) Snapshot(t testing.TB, stateFile string) {
	t.Helper()
	q := vm.dialQMP(t)
	defer q.conn.Close()
	for _, step := range []struct {
		cmd  string
		args any
	}{
		{"stop", nil},
		{"migrate-set-capabilities", migrationCaps},
		{"migrate", map[string]any{"uri": "exec:cat > " + stateFile}},
	} {
		if err := q.execute(step.cmd, step.args); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.waitMigration(); err != nil {
		t.Fatal(err)
	}
}

// Restore loads stateFile into a VM started with Options.Incoming and
// resumes it.
func (vm *VM) Restore(t testing.TB, stateFile string) {
	t.Helper()
	q := vm.dialQMP(t)
	defer q.conn.Close()
	if err := q.execute("migrate-set-capabilities", migrationCaps); err != nil {
		t.Fatal(err)
	}
	if err := q.execute("migrate-incoming", map[string]any{"uri": "exec:cat " + stateFile}); err != nil {
		t.Fatal(err)
	}
	if err := q.waitMigration(); err != nil {
		t.Fatal(err)
	}
	if err := q.execute("cont", nil); err != nil {
		t.Fatal(err)
	}
}

func (vm *VM) dialQMP(t testing.TB) *qmp {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), qmpTimeout)
	defer cancel()
	q, err := dialQMP(ctx, vm.QMP)
	if err != nil {
		t.Fatal(err)
	}
	return q
}
