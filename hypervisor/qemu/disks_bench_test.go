package qemu

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// BenchmarkDiskSlotsRestore restores the guest baked without spare disk
// slots and with testDiskSlots, interleaved, and reports each one's phase
// medians in ms and its device state's size:
//
//	go test -run '^$' -bench DiskSlotsRestore -benchtime 9x ./hypervisor/qemu
func BenchmarkDiskSlotsRestore(b *testing.B) {
	d := newTestDriver(b)
	links := []struct {
		name string
		link string
	}{{"slots0", bakedLink(b, d)}, {"slots8", bakedSlotsLink(b, d)}}
	stagers := make([]*stager, len(links))
	for i, l := range links {
		stagers[i] = newStager(b, filepath.Join(b.TempDir(), l.name), l.link)
	}
	phases := map[string][]time.Duration{}
	for b.Loop() {
		for i, l := range links {
			restoreOnce(b, d, stagers[i], l.name, hypervisor.RestoreRequest{Mode: hypervisor.ModeMmap}, phases)
		}
	}
	reportMedians(b, phases)
	for _, l := range links {
		st, err := os.Stat(filepath.Join(l.link, StateFile))
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(st.Size()), l.name+"-state-bytes")
	}
}

// BenchmarkAttachDisk attaches an image to a spare slot of a running
// guest, has the guest probe the slot again, and detaches it, and reports
// the medians in ms of the attach and detach (QMP round trips) and of the
// guest's probe (an exec of it, less an exec of true):
//
//	go test -run '^$' -bench AttachDisk -benchtime 20x ./hypervisor/qemu
func BenchmarkAttachDisk(b *testing.B) {
	d := newTestDriver(b)
	s := newStager(b, b.TempDir(), bakedSlotsLink(b, d))
	v, c := restoreReady(b, d, hypervisor.RestoreRequest{StagedDir: s.stage(), RunDir: s.runDir(), Mode: hypervisor.ModeMmap})
	const slot = 0
	devs := strings.Fields(run(b, c, "/bin/sh", "-c", diskNamed, "sh", diskSerial(slot)))
	if len(devs) != 2 {
		b.Fatalf("devices with serial %s: %q, want one disk and its virtio device", diskSerial(slot), devs)
	}
	img, _ := slotImage(b, 8<<20, false)
	ctx := testContext(b, 10*time.Minute)
	phases := map[string][]time.Duration{}
	timed := func(name string, f func()) {
		t := time.Now()
		f()
		phases[name] = append(phases[name], time.Since(t))
	}
	for b.Loop() {
		timed("attach", func() {
			if _, err := v.AttachDisk(ctx, slot, img); err != nil {
				b.Fatal(err)
			}
		})
		timed("exec-true", func() { run(b, c, "true") })
		timed("exec-probe", func() { run(b, c, "/bin/sh", "-c", reprobeSlot, "sh", devs[1]) })
		timed("detach", func() {
			if err := v.DetachDisk(ctx, slot); err != nil {
				b.Fatal(err)
			}
		})
	}
	reportMedians(b, phases)
}

func reportMedians(b *testing.B, phases map[string][]time.Duration) {
	for name, ds := range phases {
		slices.Sort(ds)
		b.ReportMetric(float64(ds[len(ds)/2].Microseconds())/1000, name+"-ms")
	}
}
