package apifake

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
)

func TestOpsAndBodies(t *testing.T) {
	record := filepath.Join(t.TempDir(), "requests.jsonl")
	lines := `{"method":"PUT","op":"vm.restore","body":{"source_url":"file:///s"},"status":204}
{"method":"PUT","op":"vm.resume","status":204}
{"method":"PATCH","op":"vm","body":{"state":"Paused"},"status":204}
{"method":"PUT","op":"vm.resume","status":405}
`
	if err := os.WriteFile(record, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	wantOps := []string{"PUT vm.restore", "PUT vm.resume", "PATCH vm", "PUT vm.resume"}
	if got := Ops(t, record); !slices.Equal(got, wantOps) {
		t.Errorf("ops %v, want %v", got, wantOps)
	}
	tests := []struct {
		method, op string
		want       []map[string]any
	}{
		{"PUT", "vm.restore", []map[string]any{{"source_url": "file:///s"}}},
		{"PUT", "vm.resume", []map[string]any{nil, nil}},
		{"PATCH", "vm", []map[string]any{{"state": "Paused"}}},
		{"PUT", "vm", nil},
	}
	for _, tt := range tests {
		if got := Bodies(t, record, tt.method, tt.op); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("bodies of %s %s = %v, want %v", tt.method, tt.op, got, tt.want)
		}
	}
	if got := Ops(t, filepath.Join(t.TempDir(), "none.jsonl")); len(got) != 0 {
		t.Errorf("ops of a fake never started: %v", got)
	}
}
