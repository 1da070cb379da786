package qemu

import (
	"slices"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// BenchmarkRestore restores the baked guest to a responding agent, one VM
// at a time, in copy and mmap, each bare and with a NIC (a tap in a network
// namespace) and a rootfs disk, interleaved so every variant sees the same
// host load (the machine is shared and noisy), and reports each variant's
// phase medians in ms:
//
//	go test -run '^$' -bench Restore -benchtime 9x ./hypervisor/qemu
func BenchmarkRestore(b *testing.B) {
	d := newTestDriver(b)
	s := newStager(b, b.TempDir(), bakedLink(b, d))
	n := newTestNet(b)
	img, _ := erofsImage(b, 8<<20)
	variants := []struct {
		name string
		req  hypervisor.RestoreRequest
	}{
		{"copy", hypervisor.RestoreRequest{Mode: hypervisor.ModeCopy}},
		{"copy+net+disk", hypervisor.RestoreRequest{Mode: hypervisor.ModeCopy, NetNS: n.ns, NIC: n.nic(), Disk: img}},
		{"mmap", hypervisor.RestoreRequest{Mode: hypervisor.ModeMmap}},
		{"mmap+net+disk", hypervisor.RestoreRequest{Mode: hypervisor.ModeMmap, NetNS: n.ns, NIC: n.nic(), Disk: img}},
	}
	phases := map[string][]time.Duration{}
	for b.Loop() {
		for _, v := range variants {
			restoreOnce(b, d, s, v.name, v.req, phases)
		}
	}
	for name, ds := range phases {
		slices.Sort(ds)
		b.ReportMetric(float64(ds[len(ds)/2].Microseconds())/1000, name+"-ms")
	}
}

func restoreOnce(b *testing.B, d *Driver, s *stager, name string, req hypervisor.RestoreRequest, phases map[string][]time.Duration) {
	ctx := testContext(b, time.Minute)
	start := time.Now()
	req.StagedDir, req.RunDir = s.stage(), s.runDir()
	req.OnPhase = func(p string, d time.Duration) { phases[name+"-"+p] = append(phases[name+"-"+p], d) }
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
	phases[name+"-agent"] = append(phases[name+"-agent"], time.Since(t))
	phases[name+"-total"] = append(phases[name+"-total"], time.Since(start))
}
