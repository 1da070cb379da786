package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/stagedchain"
)

// Snapshot writes a chain link of the VM into dir: the device state
// (migration stream without guest RAM), qemu.json, then the memory.
//   - full: every non-zero page;
//   - diff: on the top link of the chain the VM was restored from, the pages
//     that changed since the restore: under mmap the anonymous pages of
//     QEMU's private mapping whose bytes differ from the staged file's, under
//     copy the memfd's pages whose hashes differ from the restored memory's.
//
// A VM restored with mmap maps its RAM privately (share=off), which QEMU
// 7.2 streams in full even with x-ignore-shared: the stream is filtered on
// its way to disk (filterRAM) and the link says so (stateMemory).
//
// The VM is paused first and left paused. QEMU 7.2 refuses a second
// migration from a VM a finished one paused, so resume it (or restore the
// link) before snapshotting again.
func (v *VM) Snapshot(ctx context.Context, dir string, kind hypervisor.SnapshotKind) error {
	if err := checkKind(kind); err != nil {
		return err
	}
	if err := v.Pause(ctx); err != nil {
		return err
	}
	return v.snapshot(ctx, dir, kind)
}

// SnapshotLive is Snapshot of a running VM that stops the guest only at
// the end: QEMU streams the RAM of an mmap restore (to be dropped) while
// the guest runs, as a live migration does, then stops it to save the
// device state, after which the changed pages are read. A guest that
// dirties memory faster than the stream converges is stopped after
// liveBudget. The VM is left paused, on error too.
func (v *VM) SnapshotLive(ctx context.Context, dir string, kind hypervisor.SnapshotKind) error {
	if err := checkKind(kind); err != nil {
		return err
	}
	err := v.snapshot(ctx, dir, kind)
	if err != nil {
		if perr := v.Pause(context.WithoutCancel(ctx)); perr != nil {
			return errors.Join(err, perr)
		}
	}
	return err
}

func checkKind(kind hypervisor.SnapshotKind) error {
	if kind != hypervisor.SnapshotFull && kind != hypervisor.SnapshotDiff {
		return fmt.Errorf("qemu snapshot kind %q: want %q or %q", kind, hypervisor.SnapshotFull, hypervisor.SnapshotDiff)
	}
	return nil
}

// snapshot writes the link; the migration stops the VM if it still runs.
func (v *VM) snapshot(ctx context.Context, dir string, kind hypervisor.SnapshotKind) error {
	ram, err := v.openRAM(ctx, kind)
	if err != nil {
		return err
	}
	defer ram.Close()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create snapshot dir: %w", err)
	}
	stats, err := v.saveState(ctx, filepath.Join(dir, StateFile))
	if err != nil {
		return err
	}
	if err := WriteShape(dir, v.shape); err != nil {
		return err
	}
	build, err := v.build(ctx)
	if err != nil {
		return err
	}
	meta := v.linkMeta(build)
	if stats.Dropped > 0 {
		meta.StateMemory = chain.StateMemoryFiltered
	}
	if kind == hypervisor.SnapshotDiff {
		return v.writeDiff(ctx, ram, meta, dir)
	}
	return writeFull(ctx, ram, v.shape.MemoryBytes, meta, dir)
}

func writeFull(ctx context.Context, ram guestRAM, size int64, meta chain.Meta, dir string) error {
	regions, err := ram.regions()
	if err != nil {
		return err
	}
	if _, err := chain.WriteFullFrom(ctx, ram, size, regions, meta, dir); err != nil {
		return fmt.Errorf("write memory: %w", err)
	}
	return nil
}

func (v *VM) writeDiff(ctx context.Context, ram guestRAM, meta chain.Meta, dir string) error {
	dirty, err := ram.changed(ctx)
	if err != nil {
		return fmt.Errorf("find the pages changed since the restore: %w", err)
	}
	if _, err := chain.WriteDiffOn(ctx, ram, dirty, v.staged.Top(), meta, dir); err != nil {
		return fmt.Errorf("write memory: %w", err)
	}
	return nil
}

// bootGuestOS is the guest a booted VM runs: Boot takes a Linux kernel.
const bootGuestOS = "linux"

// linkMeta describes the link a snapshot writes. A restored VM's guest is
// the one its chain describes (its OS, page size, hugepages and shared
// memory steer the restore policy), so those carry over; only a booted VM
// is described from its shape.
func (v *VM) linkMeta(build string) chain.Meta {
	files := []string{StateFile, ShapeFile}
	if v.staged != nil {
		return stagedchain.Meta(v.staged, Name, build, files)
	}
	return chain.Meta{
		Hypervisor: Name, HypervisorBuild: build, GuestOS: bootGuestOS,
		VCPUs: v.shape.VCPUs, PageSize: int64(os.Getpagesize()), StateFiles: files,
	}
}

// build names the running QEMU the way `--version` does, asked over QMP
// so that only a snapshot pays for it, not every restore.
func (v *VM) build(ctx context.Context) (string, error) {
	var ver struct {
		QEMU    struct{ Major, Minor, Micro int } `json:"qemu"`
		Package string                            `json:"package"`
	}
	if err := v.qmp.Execute(ctx, "query-version", nil, &ver); err != nil {
		return "", fmt.Errorf("query qemu version: %w", err)
	}
	q := ver.QEMU
	build := fmt.Sprintf("QEMU emulator version %d.%d.%d", q.Major, q.Minor, q.Micro)
	if pkg := strings.TrimSpace(ver.Package); pkg != "" {
		build += " (" + pkg + ")"
	}
	return build, nil
}

// saveState writes the device-state stream to path, durably, without
// guest RAM: QEMU writes into a pipe and filterRAM copies it to the file.
func (v *VM) saveState(ctx context.Context, path string) (ramStats, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return ramStats{}, fmt.Errorf("create device state: %w", err)
	}
	defer f.Close()
	stats, err := v.migrateFiltered(ctx, f)
	if err != nil {
		return stats, fmt.Errorf("save device state: %w", err)
	}
	if err := f.Sync(); err != nil {
		return stats, fmt.Errorf("sync device state: %w", err)
	}
	return stats, f.Close()
}
