package qemu

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// A staged chain may hold only a prefix of its links in the memory file
// (chain.StagedMemoryInfo); the restore writes the other links' pages into
// the guest's memory before it resumes: into the memfd under copy, into
// QEMU's private mapping of the file under mmap (through /proc/PID/mem,
// which makes them copy-on-write pages exactly as the guest's own writes
// would), never into the shared file. Their hashes are kept: a later diff
// must not count them as changed unless the guest changed them again.

// applyDeltas writes the pending links' pages at their offsets into w,
// oldest first, and records their hashes in written. Their layout is
// checked as they stream; their data was verified when the snapshotter
// committed them (chain.Staged.ApplyPending).
func applyDeltas(ctx context.Context, staged *chain.Staged, w io.WriterAt, written *pageHashes) error {
	err := staged.ApplyPending(ctx, func(off int64, b []byte) error {
		if _, err := w.WriteAt(b, off); err != nil {
			return fmt.Errorf("write guest memory at %d: %w", off, err)
		}
		written.add(off, b)
		return nil
	})
	if err != nil {
		return fmt.Errorf("write the pending links into the guest: %w", err)
	}
	return nil
}

// fillCopy makes a copy restore's memfd: the staged file's data, then the
// pending links' pages, made in the VM's cgroup (req.Charge) so the guest's
// memory is the VM's, not the shim's; the fill phase includes entering and
// leaving the cgroup. It returns the staged file too, open, for the page
// hashes a diff will compare the memory with (hashLater): made once the VM
// is loaded, not to compete with its start for the CPUs.
func fillCopy(ctx context.Context, req hypervisor.RestoreRequest, staged *chain.Staged, size int64, written *pageHashes) (memfd, src *os.File, err error) {
	t := time.Now()
	var delta time.Duration
	err = req.Charge(func() error {
		var err error
		if memfd, src, err = fillMemfd(staged.MemoryPath(), size); err != nil || len(staged.Pending()) == 0 {
			return err
		}
		d := time.Now()
		err = applyDeltas(ctx, staged, memfd, written)
		delta = time.Since(d)
		return err
	})
	if err != nil {
		if memfd != nil {
			memfd.Close()
			src.Close()
		}
		return nil, nil, err
	}
	req.Phase("fill", time.Since(t)-delta)
	if delta > 0 {
		req.Phase("delta", delta)
	}
	return memfd, src, nil
}

// writeDeltas writes the pending links into an mmap restore's private
// mapping of the staged file.
func (v *VM) writeDeltas(ctx context.Context) error {
	flat, err := os.Open(v.staged.MemoryPath())
	if err != nil {
		return fmt.Errorf("open staged memory: %w", err)
	}
	defer flat.Close()
	m, err := fileMapping(v.PID(), flat, v.shape.MemoryBytes)
	if err != nil {
		return err
	}
	mem, err := os.OpenFile(fmt.Sprintf("/proc/%d/mem", v.PID()), os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open qemu's memory: %w", err)
	}
	defer mem.Close()
	return applyDeltas(ctx, v.staged, io.NewOffsetWriter(mem, int64(m.addr)), v.written)
}
