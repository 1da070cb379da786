package qemu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// benchMemory is the guest the fork benchmark forks.
const benchMemory = 512 << 20

// BenchmarkFork measures, in each mode, for a 512 MiB guest that dirtied
// 8 MiB (a file in its tmpfs) after its restore:
//   - the guest's pause for a fork (a live diff snapshot, what the shim
//     takes) and for a full checkpoint (a live full snapshot), from QEMU's
//     STOP event to its RESUME event, and the bytes each link writes;
//   - first restores, each to a responding agent: of the fork on a node
//     that has the parent flattened (staged by hard link, its pages written
//     into the guest), of the full checkpoint as a new image (flattened
//     first, as the snapshotter does), and of the fork's chain with its
//     flat file cached; with the bytes each writes to the node's disk.
//
// Medians per round; rounds interleave the two modes:
//
//	go test -run '^$' -bench Fork -benchtime 5x -timeout 30m ./hypervisor/qemu
func BenchmarkFork(b *testing.B) {
	d := newTestDriver(b)
	root := b.TempDir()
	base, err := bakeGuest(d, filepath.Join(root, "bake"), benchMemory, 0)
	if err != nil {
		b.Fatalf("bake: %v", err)
	}
	parent := newStager(b, filepath.Join(root, "parent"), base)
	m := benchMetrics{}
	for i := 0; b.Loop(); i++ {
		for _, mode := range []hypervisor.Mode{hypervisor.ModeMmap, hypervisor.ModeCopy} {
			forkRound(b, d, parent, mode, filepath.Join(root, fmt.Sprintf("%s%d", mode, i)), m)
		}
	}
	m.report(b)
}

// benchMetrics collects samples by name.
type benchMetrics map[string][]float64

func (m benchMetrics) ms(name string, d time.Duration) {
	m[name+"-ms"] = append(m[name+"-ms"], float64(d.Microseconds())/1000)
}

func (m benchMetrics) mib(name string, n int64) {
	m[name+"-MiB"] = append(m[name+"-MiB"], float64(n)/(1<<20))
}

// phases records restore phases under name.
func (m benchMetrics) phases(name string) func(string, time.Duration) {
	return func(phase string, d time.Duration) { m.ms(name+"-"+phase, d) }
}

// report reports each metric's median.
func (m benchMetrics) report(b *testing.B) {
	for name, v := range m {
		slices.Sort(v)
		b.ReportMetric(v[len(v)/2], name)
	}
}

func forkRound(b *testing.B, d *Driver, parent *stager, mode hypervisor.Mode, dir string, m benchMetrics) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	v, c := restoreReady(b, d, hypervisor.RestoreRequest{StagedDir: parent.stage(), RunDir: parent.runDir(), Mode: mode})
	sh(b, c, dirtyEight)
	fork, full := filepath.Join(dir, "fork"), filepath.Join(dir, "full")
	m.ms(string(mode)+"-fork-pause", pauseOf(b, v, fork, hypervisor.SnapshotDiff))
	m.ms(string(mode)+"-full-pause", pauseOf(b, v, full, hypervisor.SnapshotFull))
	m.mib(string(mode)+"-fork-written", dirBytes(b, fork))
	m.mib(string(mode)+"-full-written", dirBytes(b, full))
	v.Close()

	delta := &stager{t: b, root: filepath.Join(dir, "delta"), links: []string{parent.links[0], fork}, flat: parent.flat, covers: 1}
	m.ms(string(mode)+"-fork-first-restore", timeRestore(b, d, delta, mode, nil, m.phases(string(mode)+"-fork-first-restore")))
	var flatten time.Duration
	newImage := &stager{t: b, root: filepath.Join(dir, "image"), links: []string{full}, flat: filepath.Join(dir, "image-flat")}
	flattenFirst := func() {
		t := time.Now()
		if err := chain.Flatten(context.Background(), newImage.links, newImage.flat); err != nil {
			b.Fatal(err)
		}
		flatten = time.Since(t)
	}
	m.ms(string(mode)+"-full-first-restore", timeRestore(b, d, newImage, mode, flattenFirst, m.phases(string(mode)+"-full-first-restore")))
	m.ms(string(mode)+"-full-flatten", flatten)
	m.mib(string(mode)+"-full-first-restore-written", allocatedBytes(b, newImage.flat))
	cached := newStager(b, filepath.Join(dir, "cached"), parent.links[0], fork)
	m.ms(string(mode)+"-cached-restore", timeRestore(b, d, cached, mode, nil, m.phases(string(mode)+"-cached-restore")))
}

// pauseOf takes a live snapshot of kind into dir and returns how long the
// guest was stopped, by QEMU's event times.
func pauseOf(b *testing.B, v *VM, dir string, kind hypervisor.SnapshotKind) time.Duration {
	ctx := testContext(b, 2*time.Minute)
	stopped, cancel := v.qmp.Expect(func(ev Event) bool { return ev.Name == "STOP" })
	defer cancel()
	resumed, cancelResume := v.qmp.Expect(func(ev Event) bool { return ev.Name == "RESUME" })
	defer cancelResume()
	if err := v.SnapshotLive(ctx, dir, kind); err != nil {
		b.Fatalf("%s snapshot: %v", kind, err)
	}
	stop, err := stopped(ctx)
	if err != nil {
		b.Fatal(err)
	}
	res, err := resumed(ctx)
	if err != nil {
		b.Fatal(err)
	}
	return res.At.Sub(stop.At)
}

// timeRestore times a first restore: prepare (the node's work before
// staging, if any), stage, restore, resume, agent answering.
func timeRestore(b *testing.B, d *Driver, s *stager, mode hypervisor.Mode, prepare func(), onPhase func(string, time.Duration)) time.Duration {
	if err := os.MkdirAll(s.root, 0o755); err != nil {
		b.Fatal(err)
	}
	ctx := testContext(b, time.Minute)
	start := time.Now()
	if prepare != nil {
		prepare()
	}
	v, err := d.Restore(ctx, hypervisor.RestoreRequest{StagedDir: s.stage(), RunDir: s.runDir(), Mode: mode, OnPhase: onPhase})
	if err != nil {
		b.Fatal(err)
	}
	defer v.Close()
	if err := v.Resume(ctx); err != nil {
		b.Fatal(err)
	}
	c, err := agent.WaitReady(ctx, v.DialAgent)
	if err != nil {
		b.Fatal(err)
	}
	took := time.Since(start)
	c.Close()
	return took
}

// dirBytes is the bytes the files in dir take on disk.
func dirBytes(b *testing.B, dir string) int64 {
	entries, err := os.ReadDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	for _, e := range entries {
		n += allocatedBytes(b, filepath.Join(dir, e.Name()))
	}
	return n
}

func allocatedBytes(b *testing.B, path string) int64 {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		b.Fatal(err)
	}
	return st.Blocks * 512
}
