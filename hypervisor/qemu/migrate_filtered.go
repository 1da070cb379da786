package qemu

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/vmmproc"
)

// migratePipeSize is the pipe QEMU migrates into: an mmap restore's RAM
// streams through it (to be dropped), in fewer wake-ups than 64 KiB allow.
const migratePipeSize = 1 << 20

// Outgoing migration parameters. QEMU 7.2 throttles a migration to 128
// MiB/s by default; this one goes to a local pipe, so it is not throttled.
// A live migration stops the guest once what is left to send takes less
// than migrateDowntime, and is made to stop after liveBudget at the latest
// (the guest may dirty memory faster than the stream drains it).
const (
	migrateBandwidth = 64 << 30
	migrateDowntime  = 50 // ms
	liveBudget       = 3 * time.Second
)

// migrateFiltered migrates the VM's state into w without the guest RAM's
// pages: QEMU writes into a pipe, filterRAM reads it. The stream is whole
// when QEMU closes its end after the migration completed.
func (v *VM) migrateFiltered(ctx context.Context, w io.Writer) (ramStats, error) {
	ctx, cancel := vmmproc.WithDefaultTimeout(ctx, migrateTimeout)
	defer cancel()
	if err := v.command(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": migrateBandwidth, "downtime-limit": migrateDowntime}); err != nil {
		return ramStats{}, fmt.Errorf("set migration parameters: %w", err)
	}
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
	// Stopping the guest makes a live migration converge; a stop of a
	// stopped guest changes nothing.
	stop := time.AfterFunc(liveBudget, func() { v.Pause(ctx) })
	merr := v.migrate(ctx, "migrate", pw)
	stop.Stop()
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
