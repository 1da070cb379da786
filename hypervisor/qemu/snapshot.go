package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
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
	return v.snapshot(ctx, dir, kind, nil)
}

// SnapshotLive is Snapshot of a running VM that stops its guest only while
// it captures the state: QEMU streams the RAM of an mmap restore (to be
// dropped) while the guest runs, as a live migration does, stops it to save
// the device state, a diff's changed pages are copied out (up to
// maxCaptured) or a full snapshot's pages written to the page cache, and
// the guest runs again before the rest is written and made durable. A guest that
// dirties memory faster than the stream drains is stopped after
// liveBudget. The VM is left running, on error too.
func (v *VM) SnapshotLive(ctx context.Context, dir string, kind hypervisor.SnapshotKind) error {
	if err := checkKind(kind); err != nil {
		return err
	}
	err := v.snapshot(ctx, dir, kind, v.Resume)
	if err != nil {
		if rerr := v.Resume(context.WithoutCancel(ctx)); rerr != nil {
			return errors.Join(err, rerr)
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
// resume (if set) runs once the state and the pages are written (a live
// diff's pages once they are copied out), before the files are synced.
func (v *VM) snapshot(ctx context.Context, dir string, kind hypervisor.SnapshotKind, resume func(context.Context) error) error {
	if err := chain.CheckNoLink(dir); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	ram, err := v.openRAM(ctx, kind)
	if err != nil {
		return err
	}
	defer ram.Close()
	// A live diff copies the changed pages out to resume the guest early;
	// the memory for them is made ready before the guest stops.
	var buf *pageBuffer
	if kind == hypervisor.SnapshotDiff && resume != nil {
		buf = &pageBuffer{}
		defer buf.release()
		buf.reserve(ctx, ram)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create snapshot dir: %w", err)
	}
	if err := WriteShape(dir, v.shape); err != nil {
		return err
	}
	build, err := v.build(ctx)
	if err != nil {
		return err
	}
	state, err := os.OpenFile(filepath.Join(dir, StateFile), os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("create device state: %w", err)
	}
	defer state.Close()
	stats, err := v.migrateFiltered(ctx, state)
	if err != nil {
		return fmt.Errorf("save device state: %w", err)
	}
	meta := v.linkMeta(build)
	if stats.Dropped > 0 {
		meta.StateMemory = chain.StateMemoryFiltered
	}
	resumeGuest := func() error {
		if resume == nil {
			return nil
		}
		return resume(ctx)
	}
	sync := func() error { return syncFiles(state, filepath.Join(dir, ShapeFile)) }
	if kind == hypervisor.SnapshotDiff {
		return v.writeDiff(ctx, ram, meta, dir, buf, resumeGuest, sync)
	}
	return writeFull(ctx, ram, v.shape.MemoryBytes, meta, dir, then(resumeGuest, sync))
}

// then returns a function running a, then b if a succeeded.
func then(a, b func() error) func() error {
	return func() error {
		if err := a(); err != nil {
			return err
		}
		return b()
	}
}

func writeFull(ctx context.Context, ram guestRAM, size int64, meta chain.Meta, dir string, written func() error) error {
	regions, err := ram.regions()
	if err != nil {
		return err
	}
	if _, err := chain.WriteFullFrom(ctx, ram, size, regions, meta, dir, written); err != nil {
		return fmt.Errorf("write memory: %w", err)
	}
	return nil
}

// writeDiff writes the pages changed since the restore. Given a buffer
// (a live snapshot), unless they are many, they are copied into it and the
// guest resumes before they are written: the pause of a fork is then
// finding and copying them.
func (v *VM) writeDiff(ctx context.Context, ram guestRAM, meta chain.Meta, dir string, buf *pageBuffer, resume, sync func() error) error {
	dirty, err := ram.changed(ctx)
	if err != nil {
		return fmt.Errorf("find the pages changed since the restore: %w", err)
	}
	var mem io.ReaderAt = ram
	written := then(resume, sync)
	if buf != nil {
		captured, ok, err := capturePages(ram, dirty, buf)
		if err != nil {
			return err
		}
		if ok {
			if err := resume(); err != nil {
				return err
			}
			mem, written = captured, sync
		}
	}
	if _, err := chain.WriteDiffOn(ctx, mem, dirty, v.staged.Top(), meta, dir, written); err != nil {
		return fmt.Errorf("write memory: %w", err)
	}
	return nil
}

// syncFiles makes state and the file at path durable.
func syncFiles(state *os.File, path string) error {
	if err := state.Sync(); err != nil {
		return fmt.Errorf("sync device state: %w", err)
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
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
