package qemu

import (
	"context"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/vmmproc"
)

// migratePipeSize is the pipe QEMU migrates into: an mmap restore's RAM
// streams through it (to be dropped), in fewer wake-ups than 64 KiB allow.
const migratePipeSize = 1 << 20

// migrateFiltered migrates the VM's state into w without the guest RAM's
// pages: QEMU writes into a pipe, filterRAM reads it. The stream is whole
// when QEMU closes its end after the migration completed.
func (v *VM) migrateFiltered(ctx context.Context, w io.Writer) (ramStats, error) {
	ctx, cancel := vmmproc.WithDefaultTimeout(ctx, migrateTimeout)
	defer cancel()
	pr, pw, err := os.Pipe()
	if err != nil {
		return ramStats{}, fmt.Errorf("create migration pipe: %w", err)
	}
	defer pr.Close()
	// A failure only costs speed: the default pipe size works.
	unix.FcntlInt(pw.Fd(), unix.F_SETPIPE_SZ, migratePipeSize)
	type result struct {
		stats ramStats
		err   error
	}
	done := make(chan result, 1)
	go func() {
		st, err := filterRAM(w, pr, ramID)
		if err != nil {
			// Drain, so QEMU is not left blocked on a full pipe.
			io.Copy(io.Discard, pr)
		}
		done <- result{st, err}
	}()
	merr := v.migrate(ctx, "migrate", pw)
	pw.Close()
	if merr == nil {
		select {
		case r := <-done:
			return r.stats, r.err
		case <-ctx.Done():
			merr = fmt.Errorf("wait for the end of the migration stream: %w", ctx.Err())
		}
	}
	// QEMU may still hold its end: closing ours ends the filter.
	pr.Close()
	<-done
	return ramStats{}, merr
}
