package qemu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// Snapshot writes a full chain link of the VM into dir: the device state
// (migration stream without the RAM, x-ignore-shared), qemu.json, then the
// memory through chain.WriteFull. The VM is left paused. QEMU 7.2 refuses
// a second migration from a VM a finished one paused, so resume it (or
// restore the link) before snapshotting again.
func (v *VM) Snapshot(ctx context.Context, dir string, kind hypervisor.SnapshotKind) error {
	if kind != hypervisor.SnapshotFull {
		return fmt.Errorf("qemu snapshot kind %q: QEMU 7.2 cannot report the pages dirtied in a file-backed guest, only %q is supported", kind, hypervisor.SnapshotFull)
	}
	if v.memPath == "" {
		return fmt.Errorf("qemu snapshot: the VM was restored with mmap, its changed pages are private to QEMU (share=off); restore with copy to snapshot it")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create snapshot dir: %w", err)
	}
	if err := v.Pause(ctx); err != nil {
		return err
	}
	if err := v.saveState(ctx, filepath.Join(dir, StateFile)); err != nil {
		return err
	}
	if err := WriteShape(dir, v.shape); err != nil {
		return err
	}
	meta := chain.Meta{
		Hypervisor:      "qemu",
		HypervisorBuild: v.build,
		GuestOS:         "linux",
		VCPUs:           v.shape.VCPUs,
		PageSize:        int64(os.Getpagesize()),
		StateFiles:      []string{StateFile, ShapeFile},
	}
	if _, err := chain.WriteFull(ctx, v.memPath, meta, dir); err != nil {
		return fmt.Errorf("write memory: %w", err)
	}
	return nil
}

// saveState writes the device-state stream to path, durably.
func (v *VM) saveState(ctx context.Context, path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("create device state: %w", err)
	}
	defer f.Close()
	if err := v.migrate(ctx, "migrate", f); err != nil {
		return fmt.Errorf("save device state: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync device state: %w", err)
	}
	return f.Close()
}
