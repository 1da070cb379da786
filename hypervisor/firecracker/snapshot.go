package firecracker

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/dirtylog"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/stagedchain"
)

// dirtyLog is the VM's dirty page log in its run directory.
const dirtyLog = "dirty-pages"

// snapshotCreate is the PUT /snapshot/create body (SnapshotCreateParams).
type snapshotCreate struct {
	MemFilePath  string `json:"mem_file_path"`
	SnapshotPath string `json:"snapshot_path"`
	SnapshotType string `json:"snapshot_type"`
}

// Snapshot writes a chain link of the paused VM into dir: the vmstate goes
// straight into dir, the memory into a scratch file in the run directory
// that the chain writer turns into the link's extents.
//   - full: a Full snapshot, every non-zero page;
//   - diff: a Diff snapshot, the pages dirtied since the restore (dirty page
//     tracking is on from the load) or the previous snapshot, merged into
//     the VM's dirty log, whose pages the link holds: the pages changed
//     since the restore. A Full snapshot restarts Firecracker's dirty log,
//     after which a diff is refused with hypervisor.ErrNoDiffBase.
func (v *vm) Snapshot(ctx context.Context, dir string, kind hypervisor.SnapshotKind) error {
	var fcKind string
	switch kind {
	case hypervisor.SnapshotFull:
		fcKind = "Full"
	case hypervisor.SnapshotDiff:
		if v.dirtyLost {
			return fmt.Errorf("diff snapshot: a full snapshot restarted %s's dirty page log since the restore: %w", Name, hypervisor.ErrNoDiffBase)
		}
		fcKind = "Diff"
	default:
		return fmt.Errorf("snapshot kind %q: want %q or %q", kind, hypervisor.SnapshotFull, hypervisor.SnapshotDiff)
	}
	if err := chain.CheckNoLink(dir); err != nil {
		return fmt.Errorf("snapshot: %w", err)
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
	body := snapshotCreate{MemFilePath: mem, SnapshotPath: filepath.Join(dir, vmstateFile), SnapshotType: fcKind}
	if err := v.api.call(ctx, "PUT", "snapshot/create", body); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	meta := stagedchain.Meta(v.staged, Name, v.build, []string{vmstateFile})
	if kind == hypervisor.SnapshotDiff {
		return v.writeDiff(ctx, mem, meta, dir)
	}
	v.dirtyLost = true
	if _, err := chain.WriteFull(ctx, mem, meta, dir); err != nil {
		return fmt.Errorf("write snapshot link: %w", err)
	}
	return nil
}

// writeDiff merges a Diff snapshot's memory into the dirty log and writes
// the log's pages as a diff on the chain the VM was restored from.
func (v *vm) writeDiff(ctx context.Context, mem string, meta chain.Meta, dir string) error {
	if v.dirty == nil {
		top := v.staged.Top()
		l, err := dirtylog.New(filepath.Join(v.RunDir, dirtyLog), top.MemoryBytes, top.PageSize)
		if err != nil {
			return err
		}
		v.dirty = l
	}
	if err := v.dirty.Merge(ctx, mem); err != nil {
		return err
	}
	if _, err := v.dirty.WriteLink(ctx, v.staged.Top(), meta, dir); err != nil {
		return fmt.Errorf("write snapshot link: %w", err)
	}
	return nil
}
