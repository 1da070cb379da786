package launch

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// DeletedFile is what a task's server leaves in its bundle once Delete has
// released everything the task held. containerd runs `shim delete` after
// every shim exit, clean or not; with it there, the launcher answers with
// the task's exit itself instead of starting the server binary (~35 ms on
// this machine) to find nothing left to clean up. containerd removes the
// bundle, and it with it, once `delete` has answered.
const DeletedFile = "deleted.json"

// Deleted is a deleted task's exit, as `shim delete` reports it.
type Deleted struct {
	Pid      uint32    `json:"pid"`
	Status   uint32    `json:"status"`
	ExitedAt time.Time `json:"exitedAt"`
}

// WriteDeleted records that the task of bundle is deleted, atomically: a
// half-written record is never read as one.
func WriteDeleted(bundle string, d Deleted) error {
	data, err := json.Marshal(d)
	if err != nil {
		return fmt.Errorf("encode deleted record: %w", err)
	}
	tmp := filepath.Join(bundle, "."+DeletedFile)
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("write deleted record: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(bundle, DeletedFile)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write deleted record: %w", err)
	}
	return nil
}

// ReadDeleted reads the deleted record of bundle.
func ReadDeleted(bundle string) (Deleted, error) {
	var d Deleted
	data, err := os.ReadFile(filepath.Join(bundle, DeletedFile))
	if err != nil {
		return d, err
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return d, fmt.Errorf("read deleted record of %s: %w", bundle, err)
	}
	return d, nil
}

// Field numbers of containerd's task API DeleteResponse and of
// google.protobuf.Timestamp, encoded with protowire as bootstrap.go does.
const (
	deletePid       = 1
	deleteStatus    = 2
	deleteExitedAt  = 3
	timestampSecond = 1
	timestampNanos  = 2
)

// DeleteResponse is d as the DeleteResponse `shim delete` prints.
func (d Deleted) DeleteResponse() []byte {
	var b []byte
	if d.Pid != 0 {
		b = protowire.AppendTag(b, deletePid, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(d.Pid))
	}
	if d.Status != 0 {
		b = protowire.AppendTag(b, deleteStatus, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(d.Status))
	}
	var ts []byte
	if s := d.ExitedAt.Unix(); s != 0 {
		ts = protowire.AppendTag(ts, timestampSecond, protowire.VarintType)
		ts = protowire.AppendVarint(ts, uint64(s))
	}
	if n := d.ExitedAt.Nanosecond(); n != 0 {
		ts = protowire.AppendTag(ts, timestampNanos, protowire.VarintType)
		ts = protowire.AppendVarint(ts, uint64(n))
	}
	b = protowire.AppendTag(b, deleteExitedAt, protowire.BytesType)
	return protowire.AppendBytes(b, ts)
}
