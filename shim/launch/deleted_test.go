package launch

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/v2/pkg/protobuf"
	"github.com/containerd/containerd/v2/pkg/protobuf/proto"
)

// TestDeleteResponse: the launcher's DeleteResponse is the bytes pkg/shim's
// `delete` prints for the same exit, and decodes to it.
func TestDeleteResponse(t *testing.T) {
	tests := []struct {
		name string
		d    Deleted
	}{
		{"exit 0", Deleted{Pid: 4242, ExitedAt: time.Unix(1796387437, 674000000)}},
		{"killed", Deleted{Pid: 7, Status: 137, ExitedAt: time.Unix(1796387437, 0)}},
		{"never started", Deleted{Status: 137, ExitedAt: time.Unix(1796387437, 1)}},
		{"no exit time", Deleted{Pid: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want, err := proto.Marshal(&taskAPI.DeleteResponse{Pid: tt.d.Pid, ExitStatus: tt.d.Status, ExitedAt: protobuf.ToTimestamp(tt.d.ExitedAt)})
			if err != nil {
				t.Fatal(err)
			}
			got := tt.d.DeleteResponse()
			if string(got) != string(want) {
				t.Errorf("DeleteResponse %x, want pkg/shim's %x", got, want)
			}
			var r taskAPI.DeleteResponse
			if err := proto.Unmarshal(got, &r); err != nil {
				t.Fatal(err)
			}
			if r.Pid != tt.d.Pid || r.ExitStatus != tt.d.Status || !protobuf.FromTimestamp(r.ExitedAt).Equal(tt.d.ExitedAt) {
				t.Errorf("decoded %v, want %+v", &r, tt.d)
			}
		})
	}
}

// TestDeletedRecord: a record reads back as written; none, or one that is
// not a record, is an error.
func TestDeletedRecord(t *testing.T) {
	bundle := t.TempDir()
	if _, err := ReadDeleted(bundle); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("no record: %v, want not exist", err)
	}
	d := Deleted{Pid: 9, Status: 1, ExitedAt: time.Unix(1796387437, 5).UTC()}
	if err := WriteDeleted(bundle, d); err != nil {
		t.Fatal(err)
	}
	got, err := ReadDeleted(bundle)
	if err != nil || got.Pid != d.Pid || got.Status != d.Status || !got.ExitedAt.Equal(d.ExitedAt) {
		t.Fatalf("read %+v, %v; want %+v", got, err, d)
	}
	if entries, _ := os.ReadDir(bundle); len(entries) != 1 {
		t.Errorf("bundle holds %d entries, want the record alone", len(entries))
	}
	if err := os.WriteFile(filepath.Join(bundle, DeletedFile), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadDeleted(bundle); err == nil {
		t.Error("a truncated record read as one")
	}
}
