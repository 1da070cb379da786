package task

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	v1 "github.com/containerd/cgroups/v3/cgroup1/stats"
	v2 "github.com/containerd/cgroups/v3/cgroup2/stats"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

func TestStatsAndUpdate(t *testing.T) {
	testenv.RequireRoot(t)
	h := newHarness(t)
	cgPath := fmt.Sprintf("/cocoon-test-%d", os.Getpid())
	spec := specFor("sleep")
	spec.Linux = &specs.Linux{CgroupsPath: cgPath}
	h.create("t1", spec, newFifos(t, false, false))
	h.start("t1", "")

	resp, err := h.svc.Stats(h.ctx, &taskAPI.StatsRequest{ID: "t1"})
	if err != nil {
		t.Fatal(err)
	}
	m, err := typeurl.UnmarshalAny(resp.Stats)
	if err != nil {
		t.Fatal(err)
	}
	switch m := m.(type) {
	case *v1.Metrics:
		if m.Pids == nil || m.Pids.Current == 0 {
			t.Fatalf("v1 metrics count no processes: %+v", m.Pids)
		}
	case *v2.Metrics:
		if m.Pids == nil || m.Pids.Current == 0 {
			t.Fatalf("v2 metrics count no processes: %+v", m.Pids)
		}
	default:
		t.Fatalf("stats are %T, want cgroup v1 or v2 metrics", m)
	}

	quota, period := int64(50000), uint64(100000)
	update := func(res *specs.LinuxResources) error {
		a, err := typeurl.MarshalAnyToProto(res)
		if err != nil {
			t.Fatal(err)
		}
		_, err = h.svc.Update(h.ctx, &taskAPI.UpdateTaskRequest{ID: "t1", Resources: a})
		return err
	}
	if err := update(&specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: &quota, Period: &period}}); err != nil {
		t.Fatalf("CPU update: %v", err)
	}
	limit := int64(1 << 30)
	err = update(&specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}})
	wantCode(t, err, errdefs.ErrNotImplemented)

	if _, err := h.svc.Kill(h.ctx, &taskAPI.KillRequest{ID: "t1", Signal: 9}); err != nil {
		t.Fatal(err)
	}
	h.wait("t1", "")
	h.delete("t1", "")
	for _, sub := range []string{"pids", "cpu", "unified"} {
		dir := filepath.Join("/sys/fs/cgroup", sub, cgPath)
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("Delete left cgroup %s (stat: %v)", dir, err)
		}
	}
}

func TestStatsWithoutCgroup(t *testing.T) {
	h := newHarness(t)
	h.create("t1", specFor("sleep"), nil)
	_, err := h.svc.Stats(h.ctx, &taskAPI.StatsRequest{ID: "t1"})
	wantCode(t, err, errdefs.ErrNotFound)
}
