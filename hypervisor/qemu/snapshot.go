package qemu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/stagedchain"
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
		return fmt.Errorf("qemu snapshot of a VM restored with mmap: the guest's changed pages are private copy-on-write pages of QEMU (share=off), not in the memory file, so a link would miss them; restore with copy mode to checkpoint this guest: %w", errdefs.ErrFailedPrecondition)
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
	build, err := v.build(ctx)
	if err != nil {
		return err
	}
	if _, err := chain.WriteFull(ctx, v.memPath, v.linkMeta(build), dir); err != nil {
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
