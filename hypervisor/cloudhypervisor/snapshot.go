package cloudhypervisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/continuity/fs"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/stagedchain"
)

// snapshotConfig is the vm.snapshot body (VmSnapshotConfig in the spec).
type snapshotConfig struct {
	DestinationURL string `json:"destination_url"`
}

// Snapshot writes a full chain link of the paused VM into dir: Cloud
// Hypervisor snapshots into a scratch directory in the run directory, its
// config.json and state.json become the link's state files and its
// memory-ranges the link's memory.
func (v *vm) Snapshot(ctx context.Context, dir string, kind hypervisor.SnapshotKind) error {
	if kind != hypervisor.SnapshotFull {
		return fmt.Errorf("snapshot kind %q: %s snapshots are full only", kind, Name)
	}
	scratch, err := os.MkdirTemp(v.RunDir, "snapshot-")
	if err != nil {
		return fmt.Errorf("create snapshot scratch dir: %w", err)
	}
	defer os.RemoveAll(scratch)
	if err := v.api.put(ctx, "vm.snapshot", snapshotConfig{DestinationURL: "file://" + scratch}); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create link dir: %w", err)
	}
	for _, name := range stateFiles {
		if err := fs.CopyFile(filepath.Join(dir, name), filepath.Join(scratch, name)); err != nil {
			return fmt.Errorf("copy snapshot %s into the link: %w", name, err)
		}
	}
	if _, err := chain.WriteFull(ctx, filepath.Join(scratch, memoryFile), stagedchain.Meta(v.staged, Name, v.build, stateFiles), dir); err != nil {
		return fmt.Errorf("write snapshot link: %w", err)
	}
	return nil
}
