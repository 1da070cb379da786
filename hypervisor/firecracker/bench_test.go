package firecracker

import (
	"context"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/apifake"
)

// BenchmarkRestore measures the driver's own cost of a restore against the
// fake: spawn, API socket wait, memory backend, /snapshot/load, then Close.
func BenchmarkRestore(b *testing.B) {
	for _, mode := range []hypervisor.Mode{hypervisor.ModeMmap, hypervisor.ModeCopy} {
		b.Run(string(mode), func(b *testing.B) {
			d, _ := newDriver(b, apifake.Fake{})
			ctx, staged := context.Background(), stageChain(b)
			phases := map[string]time.Duration{}
			onPhase := func(p string, d time.Duration) { phases[p] += d }
			for b.Loop() {
				v, err := d.Restore(ctx, hypervisor.RestoreRequest{StagedDir: staged, RunDir: runDir(b), Mode: mode, OnPhase: onPhase})
				if err != nil {
					b.Fatal(err)
				}
				if err := v.Close(); err != nil {
					b.Fatal(err)
				}
			}
			for p, d := range phases {
				b.ReportMetric(float64(d.Microseconds())/float64(b.N), p+"-µs/op")
			}
		})
	}
}
