package cloudhypervisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/continuity/fs"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/dirtylog"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/stagedchain"
)

// snapshotConfig is the vm.snapshot body (VmSnapshotConfig in the spec;
// snapshot_type is the cocoonstack fork's).
type snapshotConfig struct {
	DestinationURL string `json:"destination_url"`
	SnapshotType   string `json:"snapshot_type,omitempty"`
}

// dirtyLog is the VM's dirty page log in its run directory.
const dirtyLog = "dirty-pages"

// Snapshot writes a chain link of the paused VM into dir: Cloud Hypervisor
// snapshots into a scratch directory in the run directory, its config.json
// and state.json become the link's state files and its memory-ranges the
// link's memory.
//   - full: a full snapshot, every non-zero page;
//   - diff: a "diff" snapshot (the cocoonstack fork): the first of a VM is a
//     full baseline, told against the memory the VM was restored with, the
//     later ones hold the pages dirtied since the one before; both are
//     merged into the VM's dirty log, whose pages the link holds: the pages
//     changed since the restore. A copy restore has released its restored
//     memory, so its first diff is refused with hypervisor.ErrNoDiffBase.
//     An upstream build ignores snapshot_type: its later "diffs" are full,
//     and so then is what the link holds.
func (v *vm) Snapshot(ctx context.Context, dir string, kind hypervisor.SnapshotKind) error {
	if kind != hypervisor.SnapshotFull && kind != hypervisor.SnapshotDiff {
		return fmt.Errorf("snapshot kind %q: want %q or %q", kind, hypervisor.SnapshotFull, hypervisor.SnapshotDiff)
	}
	if err := chain.CheckNoLink(dir); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	diff := kind == hypervisor.SnapshotDiff
	if diff && v.dirty == nil {
		if _, err := os.Stat(v.staged.MemoryPath()); err != nil {
			return fmt.Errorf("diff snapshot: %s's first diff is a full baseline, told against the restored memory, which is gone (%v): %w", Name, err, hypervisor.ErrNoDiffBase)
		}
	}
	scratch, err := os.MkdirTemp(v.RunDir, "snapshot-")
	if err != nil {
		return fmt.Errorf("create snapshot scratch dir: %w", err)
	}
	defer os.RemoveAll(scratch)
	body := snapshotConfig{DestinationURL: "file://" + scratch}
	if diff {
		body.SnapshotType = "diff"
	}
	if err := v.api.put(ctx, "vm.snapshot", body); err != nil {
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
	mem := filepath.Join(scratch, memoryFile)
	meta := stagedchain.Meta(v.staged, Name, v.build, stateFiles)
	if diff {
		return v.writeDiff(ctx, mem, meta, dir)
	}
	if _, err := chain.WriteFull(ctx, mem, meta, dir); err != nil {
		return fmt.Errorf("write snapshot link: %w", err)
	}
	return nil
}

// writeDiff merges a diff snapshot's memory into the dirty log (the first,
// a full baseline, as the pages that differ from the restored memory) and
// writes the log's pages as a diff on the chain the VM was restored from.
func (v *vm) writeDiff(ctx context.Context, mem string, meta chain.Meta, dir string) error {
	if v.dirty == nil {
		top := v.staged.Top()
		l, err := dirtylog.New(filepath.Join(v.RunDir, dirtyLog), top.MemoryBytes, top.PageSize)
		if err != nil {
			return err
		}
		if err := l.MergeChanged(ctx, mem, v.staged.MemoryPath()); err != nil {
			l.Close()
			return err
		}
		v.dirty = l
	} else if err := v.dirty.Merge(ctx, mem); err != nil {
		return err
	}
	if _, err := v.dirty.WriteLink(ctx, v.staged.Top(), meta, dir); err != nil {
		return fmt.Errorf("write snapshot link: %w", err)
	}
	return nil
}
