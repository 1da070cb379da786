package firecracker

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/stagedchain"
)

// snapshotCreate is the PUT /snapshot/create body (SnapshotCreateParams).
type snapshotCreate struct {
	MemFilePath  string `json:"mem_file_path"`
	SnapshotPath string `json:"snapshot_path"`
	SnapshotType string `json:"snapshot_type"`
}

// Snapshot writes a full chain link of the paused VM into dir: the vmstate
// goes straight into dir, the memory into a scratch file in the run
// directory that the chain writer turns into the link's extents.
func (v *vm) Snapshot(ctx context.Context, dir string, kind hypervisor.SnapshotKind) error {
	if kind != hypervisor.SnapshotFull {
		return fmt.Errorf("snapshot kind %q: %s snapshots are full only", kind, Name)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create link dir: %w", err)
	}
	scratch, err := os.MkdirTemp(v.RunDir, "snapshot-")
	if err != nil {
		return fmt.Errorf("create snapshot scratch dir: %w", err)
	}
	defer os.RemoveAll(scratch)
	mem := filepath.Join(scratch, "memory")
	body := snapshotCreate{MemFilePath: mem, SnapshotPath: filepath.Join(dir, vmstateFile), SnapshotType: "Full"}
	if err := v.api.call(ctx, "PUT", "snapshot/create", body); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	if _, err := chain.WriteFull(ctx, mem, stagedchain.Meta(v.staged, Name, v.build, []string{vmstateFile}), dir); err != nil {
		return fmt.Errorf("write snapshot link: %w", err)
	}
	return nil
}
