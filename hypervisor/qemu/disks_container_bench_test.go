package qemu

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// benchDirRoot is a busybox root in the guest's /tmp, for containers
// whose root is a directory: their create is runc's alone.
const benchDirRoot = "/tmp/bench-rootfs"

// BenchmarkContainerJoin measures a container joining a running VM, from
// the attach of its root's image to a spare disk slot to its first output
// (attach, create: the agent's re-probe and mount and runc create, start,
// output), against a restore of the same snapshot to its agent answering
// (restore-total), interleaved, and reports the medians in ms and the
// ratio of the two. It splits create with a container whose root is a
// directory (create-dir: runc create alone) and an exec probing a slot
// again less an exec of true (probe):
//
//	go test -run '^$' -bench ContainerJoin -benchtime 10x ./hypervisor/qemu
func BenchmarkContainerJoin(b *testing.B) {
	d := newTestDriver(b)
	link := bakedSlotsLink(b, d)
	restores := newStager(b, filepath.Join(b.TempDir(), "restores"), link)
	s := newStager(b, filepath.Join(b.TempDir(), "pod"), link)
	v, c := restoreReady(b, d, hypervisor.RestoreRequest{StagedDir: s.stage(), RunDir: s.runDir(), Mode: hypervisor.ModeMmap})
	run(b, c, "/bin/sh", "-c", "mkdir -p "+benchDirRoot+"/bin && cd "+benchDirRoot+
		" && cp /bin/busybox bin/ && for a in $(busybox --list); do ln -s busybox bin/$a; done")
	img, _ := containerImage(b)
	ctx := testContext(b, 30*time.Minute)
	phases := map[string][]time.Duration{}
	timed := func(name string, f func()) {
		t := time.Now()
		f()
		phases[name] = append(phases[name], time.Since(t))
	}
	probeSlot := strings.Fields(run(b, c, "/bin/sh", "-c", diskNamed, "sh", diskSerial(1)))
	i := 0
	for b.Loop() {
		restoreOnce(b, d, restores, "restore", hypervisor.RestoreRequest{Mode: hypervisor.ModeMmap}, phases)
		t := time.Now()
		j := timedJoin(ctx, b, v, c, img, fmt.Sprintf("join-%d", i), timed)
		phases["join"] = append(phases["join"], time.Since(t))
		j.remove(ctx, b, v, c)
		dirContainer(ctx, b, c, fmt.Sprintf("dir-%d", i), timed)
		timed("exec-true", func() { run(b, c, "true") })
		timed("exec-probe", func() { run(b, c, "/bin/sh", "-c", reprobeSlot, "sh", probeSlot[1]) })
		i++
	}
	reportMedians(b, phases)
	join, restore := median(phases["join"]), median(phases["restore-total"])
	b.ReportMetric(float64(join)/float64(restore), "join/restore")
}

// timedJoin is joinContainer with each step timed.
func timedJoin(ctx context.Context, b *testing.B, v *VM, c *agent.Client, img, id string, timed func(string, func())) *joined {
	j := &joined{id: id, slot: 0}
	var serial string
	timed("attach", func() {
		var err error
		if serial, err = v.AttachDisk(ctx, 0, img); err != nil {
			b.Fatal(err)
		}
	})
	spec := joinSpec(b, id, "echo up; exec sleep 1000")
	timed("create", func() {
		var err error
		if j.p, err = c.CreateContainerFrom(ctx, id, spec, agent.ContainerRoot{Disk: &agent.Rootfs{FSType: "erofs", Serial: serial, Size: fileSize(b, img)}}, false); err != nil {
			b.Fatalf("create %s: %v", id, err)
		}
	})
	timed("start", func() {
		if _, err := c.StartContainer(ctx, id); err != nil {
			b.Fatalf("start %s: %v", id, err)
		}
	})
	_, j.stdout, _ = j.p.Stdio()
	timed("output", func() { j.readLines(b, 1) })
	return j
}

// dirContainer creates a container over benchDirRoot, timing only that,
// and deletes it unstarted.
func dirContainer(ctx context.Context, b *testing.B, c *agent.Client, id string, timed func(string, func())) {
	timed("create-dir", func() {
		if _, err := c.CreateContainer(ctx, id, joinSpec(b, id, "true"), benchDirRoot, false); err != nil {
			b.Fatalf("create %s: %v", id, err)
		}
	})
	if err := c.DeleteContainer(ctx, id, ""); err != nil {
		b.Fatalf("delete %s: %v", id, err)
	}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
