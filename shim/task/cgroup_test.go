package task

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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
	h.launcher.memory = MemoryBudget{Guest: 256 << 20, Headroom: 32 << 20}
	cgPath := fmt.Sprintf("/cocoon-test-%d", os.Getpid())
	spec := specFor("sleep")
	created := int64(384 << 20)
	spec.Linux = &specs.Linux{CgroupsPath: cgPath, Resources: &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &created}}}
	h.create("t1", spec, newFifos(t, false, false))
	if got := memoryLimit(t, cgPath); got != created+32<<20 {
		t.Fatalf("cgroup memory limit %d after create with %d, want the limit plus headroom", got, created)
	}
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
	// CRI repeats the create's memory limit in every update.
	for _, limit := range []int64{512 << 20, 512 << 20, 1 << 30} {
		if err := update(&specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}}); err != nil {
			t.Fatalf("memory update to %d: %v", limit, err)
		}
		if got := memoryLimit(t, cgPath); got != limit+h.launcher.memory.Headroom {
			t.Fatalf("cgroup memory limit %d after an update to %d, want the limit plus %d headroom", got, limit, h.launcher.memory.Headroom)
		}
	}
	small := int64(64 << 20)
	err = update(&specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &small}})
	wantCode(t, err, errdefs.ErrInvalidArgument)

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

// memoryLimit reads the memory limit of the cgroup at path (v1 or v2).
func memoryLimit(t *testing.T, path string) int64 {
	t.Helper()
	for _, f := range []string{
		filepath.Join("/sys/fs/cgroup/memory", path, "memory.limit_in_bytes"),
		filepath.Join("/sys/fs/cgroup", path, "memory.max"),
	} {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
		if err != nil {
			t.Fatalf("parse %s: %v", f, err)
		}
		return n
	}
	t.Fatalf("no memory limit file for cgroup %s", path)
	return 0
}

func TestMemoryBudget(t *testing.T) {
	b := MemoryBudget{Guest: 512 << 20, Headroom: 100}
	limit := func(n int64) *specs.LinuxResources {
		return &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &n}}
	}
	for _, c := range []struct {
		name    string
		res     *specs.LinuxResources
		want    int64
		wantErr bool
	}{
		{"no resources", nil, 0, false},
		{"no memory limit", &specs.LinuxResources{}, 0, false},
		{"exactly the guest", limit(512 << 20), 512<<20 + 100, false},
		{"above the guest", limit(1 << 30), 1<<30 + 100, false},
		{"below the guest", limit(511 << 20), 0, true},
		{"unlimited (-1)", limit(-1), 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := b.limit(c.res)
			if (err != nil) != c.wantErr || got != c.want {
				t.Fatalf("limit = %d, %v; want %d, error %v", got, err, c.want, c.wantErr)
			}
			if err != nil && !errdefs.IsInvalidArgument(err) {
				t.Fatalf("error %v is not InvalidArgument", err)
			}
		})
	}
}
