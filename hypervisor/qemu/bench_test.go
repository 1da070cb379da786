package qemu

import (
	"slices"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// BenchmarkRestore restores the baked guest to a responding agent, one VM
// at a time, alternating copy and mmap so both see the same host load (the
// machine is shared and noisy), and reports each mode's phase medians in ms:
//
//	go test -run '^$' -bench Restore -benchtime 9x ./hypervisor/qemu
func BenchmarkRestore(b *testing.B) {
	d := newTestDriver(b)
	s := newStager(b, b.TempDir(), bakedLink(b, d))
	modes := []hypervisor.Mode{hypervisor.ModeCopy, hypervisor.ModeMmap}
	phases := map[string][]time.Duration{}
	for b.Loop() {
		for _, mode := range modes {
			restoreOnce(b, d, s, mode, phases)
		}
	}
	for name, ds := range phases {
		slices.Sort(ds)
		b.ReportMetric(float64(ds[len(ds)/2].Microseconds())/1000, name+"-ms")
	}
}

func restoreOnce(b *testing.B, d *Driver, s *stager, mode hypervisor.Mode, phases map[string][]time.Duration) {
	ctx := testContext(b, time.Minute)
	start := time.Now()
	req := hypervisor.RestoreRequest{StagedDir: s.stage(), RunDir: s.runDir(), Mode: mode,
		OnPhase: func(p string, d time.Duration) { phases[string(mode)+"-"+p] = append(phases[string(mode)+"-"+p], d) }}
	v, err := d.Restore(ctx, req)
	if err != nil {
		b.Fatal(err)
	}
	defer v.Close()
	t := time.Now()
	if err := v.Resume(ctx); err != nil {
		b.Fatal(err)
	}
	c, err := agent.WaitReady(ctx, v.DialAgent)
	if err != nil {
		b.Fatal(err)
	}
	c.Close()
	phases[string(mode)+"-agent"] = append(phases[string(mode)+"-agent"], time.Since(t))
	phases[string(mode)+"-total"] = append(phases[string(mode)+"-total"], time.Since(start))
}
