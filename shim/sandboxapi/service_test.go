package sandboxapi

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	cgroupsv2 "github.com/containerd/cgroups/v3/cgroup2/stats"
	sandboxAPI "github.com/containerd/containerd/api/runtime/sandbox/v1"
	"github.com/containerd/containerd/api/types"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/containerd/v2/plugins"
	"github.com/containerd/errdefs"
	"github.com/containerd/plugin/registry"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
)

// fakePod is a pod VM that runs until stopped or lost.
type fakePod struct {
	pid      int
	done     chan struct{}
	once     sync.Once
	exitedAt time.Time
	updates  []*specs.LinuxResources
}

func (p *fakePod) PID() int              { return p.pid }
func (p *fakePod) Done() <-chan struct{} { return p.done }
func (p *fakePod) ExitedAt() time.Time   { return p.exitedAt }
func (p *fakePod) Stats() (any, error) {
	return &cgroupsv2.Metrics{Memory: &cgroupsv2.MemoryStat{Usage: 42}}, nil
}
func (p *fakePod) Update(res *specs.LinuxResources) error {
	p.updates = append(p.updates, res)
	return nil
}
func (p *fakePod) exit() {
	p.once.Do(func() { p.exitedAt = time.Now(); close(p.done) })
}

// fakePods records what the service asks of the task service.
type fakePods struct {
	mu       sync.Mutex
	started  []task.LaunchRequest
	pod      *fakePod
	startErr error
	stopped  int
	removed  int
	idle     chan struct{}
}

func newFakePods() *fakePods { return &fakePods{idle: make(chan struct{}, 1)} }

func (f *fakePods) StartPod(_ context.Context, r task.LaunchRequest) (Pod, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.started = append(f.started, r)
	if f.startErr != nil {
		return nil, f.startErr
	}
	f.pod = &fakePod{pid: 4242, done: make(chan struct{})}
	return f.pod, nil
}

func (f *fakePods) StopPod(_ context.Context, p Pod) error {
	f.mu.Lock()
	f.stopped++
	f.mu.Unlock()
	p.(*fakePod).exit()
	return nil
}

func (f *fakePods) RemovePod(_ context.Context, p Pod) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.removed++
	return nil
}

func (f *fakePods) ShutdownIfIdle() { f.idle <- struct{}{} }

// createRequest is CreateSandbox as CRI sends it for pod id.
func createRequest(t *testing.T, id string) *sandboxAPI.CreateSandboxRequest {
	t.Helper()
	cfg := &runtime.PodSandboxConfig{
		Hostname:    "web-0",
		Annotations: map[string]string{"io.cocoon.restore-mode": "copy", "team": "a"},
		Linux: &runtime.LinuxPodSandboxConfig{CgroupParent: "/kubepods/pod1",
			Resources: &runtime.LinuxContainerResources{MemoryLimitInBytes: 1 << 30, CpuQuota: 50000, CpuPeriod: 100000},
			Sysctls:   map[string]string{"kernel.shm_rmid_forced": "1"}},
	}
	opts, err := typeurl.MarshalAnyToProto(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &sandboxAPI.CreateSandboxRequest{SandboxID: id, BundlePath: t.TempDir(), Options: opts, NetnsPath: "/run/netns/cni-1"}
}

// hostNamespaceRequest creates a pod that asks, with field, for a
// namespace of the host's.
func hostNamespaceRequest(t *testing.T, field string) *sandboxAPI.CreateSandboxRequest {
	t.Helper()
	ns := &runtime.NamespaceOption{}
	switch field {
	case "hostNetwork":
		ns.Network = runtime.NamespaceMode_NODE
	case "hostIPC":
		ns.Ipc = runtime.NamespaceMode_NODE
	case "hostPID":
		ns.Pid = runtime.NamespaceMode_NODE
	}
	cfg := &runtime.PodSandboxConfig{Linux: &runtime.LinuxPodSandboxConfig{
		SecurityContext: &runtime.LinuxSandboxSecurityContext{NamespaceOptions: ns}}}
	opts, err := typeurl.MarshalAnyToProto(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &sandboxAPI.CreateSandboxRequest{SandboxID: "host-" + field, BundlePath: t.TempDir(), Options: opts}
}

func configPathOptions(path string) OptionsFunc {
	return func(context.Context, string) (typeurl.Any, error) {
		return typeurl.MarshalAnyToProto(&runtimeoptions.Options{ConfigPath: path})
	}
}

// TestSandboxLifecycle goes through the sandbox API as containerd's CRI
// does: create, start, status, metrics, stop, wait, shutdown.
func TestSandboxLifecycle(t *testing.T) {
	ctx := context.Background()
	pods := newFakePods()
	s := New(pods, configPathOptions("/etc/cocoon/pod.toml"))
	req := createRequest(t, "sb1")
	if _, err := s.CreateSandbox(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateSandbox(ctx, req); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("second create: %v, want AlreadyExists", err)
	}
	if st := statusOf(t, s, "sb1"); st.State != stateNotReady || st.Pid != 0 {
		t.Fatalf("created sandbox: %s pid %d, want %s pid 0", st.State, st.Pid, stateNotReady)
	}
	started, err := s.StartSandbox(ctx, &sandboxAPI.StartSandboxRequest{SandboxID: "sb1"})
	if err != nil {
		t.Fatal(err)
	}
	if started.Pid != 4242 || started.CreatedAt == nil {
		t.Fatalf("start: pid %d created %v, want 4242 and a time", started.Pid, started.CreatedAt)
	}
	checkLaunch(t, pods.started[0], req.BundlePath)
	if _, err := s.StartSandbox(ctx, &sandboxAPI.StartSandboxRequest{SandboxID: "sb1"}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("second start: %v, want AlreadyExists", err)
	}
	checkRunning(t, s, "sb1")

	if _, err := s.StopSandbox(ctx, &sandboxAPI.StopSandboxRequest{SandboxID: "sb1"}); err != nil {
		t.Fatal(err)
	}
	w, err := s.WaitSandbox(ctx, &sandboxAPI.WaitSandboxRequest{SandboxID: "sb1"})
	if err != nil || w.ExitStatus != exitStopped || w.ExitedAt.AsTime().IsZero() {
		t.Fatalf("wait after stop: %v, %v; want status %d and a time", w, err, exitStopped)
	}
	if st := statusOf(t, s, "sb1"); st.State != stateNotReady || st.ExitedAt == nil {
		t.Fatalf("stopped sandbox: %s exited %v, want %s with a time", st.State, st.ExitedAt, stateNotReady)
	}
	if _, err := s.SandboxMetrics(ctx, &sandboxAPI.SandboxMetricsRequest{SandboxID: "sb1"}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("metrics of a stopped sandbox: %v, want FailedPrecondition", err)
	}
	if _, err := s.ShutdownSandbox(ctx, &sandboxAPI.ShutdownSandboxRequest{SandboxID: "sb1"}); err != nil {
		t.Fatal(err)
	}
	if pods.removed != 1 {
		t.Fatalf("shutdown removed the pod %d times, want 1", pods.removed)
	}
	if _, err := s.PingSandbox(ctx, &sandboxAPI.PingRequest{SandboxID: "sb1"}); !errdefs.IsNotFound(err) {
		t.Fatalf("ping after shutdown: %v, want NotFound", err)
	}
	select {
	case <-pods.idle:
	case <-time.After(replyGrace + 5*time.Second):
		t.Fatal("the shim was not let go after the sandbox's shutdown")
	}
}

// checkLaunch checks what StartSandbox asked the task service for: the
// pod's VM with its bundle, hostname, runtime config, network namespace,
// cgroup, resources and cocoon annotations only.
func checkLaunch(t *testing.T, r task.LaunchRequest, bundle string) {
	t.Helper()
	if r.ID != "sb1" || r.Bundle != bundle || r.Hostname != "web-0" || r.ConfigPath != "/etc/cocoon/pod.toml" {
		t.Fatalf("launch %+v: want sb1 in %s, hostname web-0, config /etc/cocoon/pod.toml", r, bundle)
	}
	spec := r.Spec
	if len(spec.Linux.Namespaces) != 1 || spec.Linux.Namespaces[0] != (specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: "/run/netns/cni-1"}) {
		t.Fatalf("namespaces %+v, want the pod's network namespace", spec.Linux.Namespaces)
	}
	if spec.Linux.CgroupsPath != "/kubepods/pod1/sb1" {
		t.Fatalf("cgroups path %q, want /kubepods/pod1/sb1", spec.Linux.CgroupsPath)
	}
	res := spec.Linux.Resources
	if res == nil || res.Memory == nil || *res.Memory.Limit != 1<<30 || res.CPU == nil || *res.CPU.Quota != 50000 || *res.CPU.Period != 100000 {
		t.Fatalf("resources %+v, want the pod's memory and CPU limits", res)
	}
	if len(spec.Annotations) != 1 || spec.Annotations["io.cocoon.restore-mode"] != "copy" {
		t.Fatalf("annotations %v, want only io.cocoon.restore-mode", spec.Annotations)
	}
	if r.Sysctls["kernel.shm_rmid_forced"] != "1" || len(r.Sysctls) != 1 {
		t.Fatalf("sysctls %v, want the pod's kernel.shm_rmid_forced = 1", r.Sysctls)
	}
}

// checkRunning checks a started sandbox's status, verbose info, platform,
// ping and metrics.
func checkRunning(t *testing.T, s *Service, id string) {
	t.Helper()
	ctx := context.Background()
	st, err := s.SandboxStatus(ctx, &sandboxAPI.SandboxStatusRequest{SandboxID: id, Verbose: true})
	if err != nil || st.State != stateReady || st.Pid != 4242 || st.ExitedAt != nil {
		t.Fatalf("running sandbox: %v, %v; want %s pid 4242, not exited", st, err, stateReady)
	}
	var info verboseInfo
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil || info.Pid != 4242 || info.RuntimeSpec == nil || info.Config.GetHostname() != "web-0" {
		t.Fatalf("verbose info %q (%v): want pid 4242, the spec and the pod config", st.Info["info"], err)
	}
	p, err := s.Platform(ctx, &sandboxAPI.PlatformRequest{SandboxID: id})
	if err != nil || p.Platform.OS != "linux" {
		t.Fatalf("platform %v, %v; want linux", p, err)
	}
	if _, err := s.PingSandbox(ctx, &sandboxAPI.PingRequest{SandboxID: id}); err != nil {
		t.Fatal(err)
	}
	m, err := s.SandboxMetrics(ctx, &sandboxAPI.SandboxMetricsRequest{SandboxID: id})
	if err != nil {
		t.Fatal(err)
	}
	v, err := typeurl.UnmarshalAny(m.Metrics.Data)
	if err != nil {
		t.Fatal(err)
	}
	if cm, ok := v.(*cgroupsv2.Metrics); !ok || cm.Memory.GetUsage() != 42 || m.Metrics.ID != id {
		t.Fatalf("metrics %T %v of %s, want the pod's cgroup v2 metrics", v, v, m.Metrics.ID)
	}
}

func statusOf(t *testing.T, s *Service, id string) *sandboxAPI.SandboxStatusResponse {
	t.Helper()
	st, err := s.SandboxStatus(context.Background(), &sandboxAPI.SandboxStatusRequest{SandboxID: id})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// runningSandbox is a service with sandbox id created and started, with
// no runtime options.
func runningSandbox(t *testing.T, id string) (*Service, *fakePods) {
	t.Helper()
	ctx := context.Background()
	pods := newFakePods()
	s := New(pods, nil)
	if _, err := s.CreateSandbox(ctx, createRequest(t, id)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.StartSandbox(ctx, &sandboxAPI.StartSandboxRequest{SandboxID: id}); err != nil {
		t.Fatal(err)
	}
	return s, pods
}

// TestSandboxVMLost: a VM that ends on its own ends the wait, with the
// status containerd gives a shim it lost.
func TestSandboxVMLost(t *testing.T) {
	ctx := context.Background()
	s, pods := runningSandbox(t, "sb1")
	if pods.started[0].ConfigPath != "" || pods.started[0].ConfigBody != "" {
		t.Fatalf("without runtime options the launch has config %q/%q, want none", pods.started[0].ConfigPath, pods.started[0].ConfigBody)
	}
	pods.pod.exit()
	w, err := s.WaitSandbox(ctx, &sandboxAPI.WaitSandboxRequest{SandboxID: "sb1"})
	if err != nil || w.ExitStatus != exitLost {
		t.Fatalf("wait: %v, %v; want status %d", w, err, exitLost)
	}
	if st := statusOf(t, s, "sb1"); st.State != stateNotReady {
		t.Fatalf("sandbox with its VM gone is %s, want %s", st.State, stateNotReady)
	}
}

// TestSandboxRefusals: what the service refuses, and a sandbox stopped
// before it started.
func TestSandboxRefusals(t *testing.T) {
	ctx := context.Background()
	pods := newFakePods()
	s := New(pods, nil)
	withRootfs := createRequest(t, "sb0")
	withRootfs.Rootfs = []*types.Mount{{Type: "bind", Source: "/x"}}
	if _, err := s.CreateSandbox(ctx, withRootfs); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("create with a rootfs: %v, want InvalidArgument", err)
	}
	for _, field := range []string{"hostNetwork", "hostIPC", "hostPID"} {
		if _, err := s.CreateSandbox(ctx, hostNamespaceRequest(t, field)); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "("+field+": true)") {
			t.Fatalf("create of a pod with %s: %v, want InvalidArgument naming %s", field, err, field)
		}
	}
	if _, err := s.StartSandbox(ctx, &sandboxAPI.StartSandboxRequest{SandboxID: "nope"}); !errdefs.IsNotFound(err) {
		t.Fatalf("start of an unknown sandbox: %v, want NotFound", err)
	}
	if _, err := s.UpdateSandbox(ctx, &sandboxAPI.UpdateSandboxRequest{SandboxID: "nope"}); !errdefs.IsNotFound(err) {
		t.Fatalf("update of an unknown sandbox: %v, want NotFound", err)
	}
	if _, err := s.CreateSandbox(ctx, createRequest(t, "sb1")); err != nil {
		t.Fatal(err)
	}
	pods.startErr = errors.New("no base image")
	if _, err := s.StartSandbox(ctx, &sandboxAPI.StartSandboxRequest{SandboxID: "sb1"}); err == nil {
		t.Fatal("start with a failing launch succeeded")
	}
	if _, err := s.StopSandbox(ctx, &sandboxAPI.StopSandboxRequest{SandboxID: "sb1"}); err != nil {
		t.Fatal(err)
	}
	if w, err := s.WaitSandbox(ctx, &sandboxAPI.WaitSandboxRequest{SandboxID: "sb1"}); err != nil || w.ExitStatus != exitStopped {
		t.Fatalf("wait of a sandbox stopped before it ran: %v, %v", w, err)
	}
	pods.startErr = nil
	if _, err := s.StartSandbox(ctx, &sandboxAPI.StartSandboxRequest{SandboxID: "sb1"}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("start after stop: %v, want FailedPrecondition", err)
	}
	if _, err := s.ShutdownSandbox(ctx, &sandboxAPI.ShutdownSandboxRequest{SandboxID: "sb1"}); err != nil {
		t.Fatal(err)
	}
	if pods.stopped != 0 || pods.removed != 0 {
		t.Fatalf("a sandbox that never ran was stopped %d and removed %d times, want 0", pods.stopped, pods.removed)
	}
}

// TestRegister: the sandbox plugin registers beside the task plugin and
// comes after it in pkg/shim's load order.
func TestRegister(t *testing.T) {
	task.Register(nil)
	Register()
	order := map[string]int{}
	for i, r := range registry.Graph(nil) {
		order[r.URI()] = i
	}
	tp, sp := order[string(plugins.TTRPCPlugin)+".task"], order[string(pluginType)+".sandbox"]
	if _, ok := order[string(pluginType)+".sandbox"]; !ok || tp >= sp {
		t.Fatalf("plugin order %v: want the task plugin before the sandbox plugin", order)
	}
}

// criUpdatedResources is containerd's podsandbox.UpdatedResources, which
// its CRI registers so: typeurl encodes it as JSON under that name.
type criUpdatedResources struct {
	Overhead  *runtime.LinuxContainerResources
	Resources *runtime.LinuxContainerResources
}

func init() {
	typeurl.Register(&criUpdatedResources{}, "io.containerd.cri.v1", "UpdatedResources")
}

// resizeRequest is UpdateSandbox as containerd's CRI sends it for an
// UpdatePodSandboxResources: the pod's resources in the sandbox's
// extensions; ext, when given, in their place.
func resizeRequest(t *testing.T, ext *anypb.Any, fields ...string) *sandboxAPI.UpdateSandboxRequest {
	t.Helper()
	if ext == nil {
		var err error
		ext, err = typeurl.MarshalAnyToProto(&criUpdatedResources{
			Overhead:  &runtime.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 10000},
			Resources: &runtime.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 150000, MemoryLimitInBytes: 2 << 30},
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return &sandboxAPI.UpdateSandboxRequest{SandboxID: "sb1", Fields: fields, Sandbox: &types.Sandbox{SandboxID: "sb1",
		Extensions: map[string]*anypb.Any{resizeExtension: ext}}}
}

// TestSandboxResize: a pod's in-place resize reaches its VM as the pod's
// limits; an update without one changes nothing; a resize that cannot be
// read, or of a pod whose VM does not run, is refused.
func TestSandboxResize(t *testing.T) {
	resized := &specs.LinuxResources{
		Memory: &specs.LinuxMemory{Limit: ptr(int64(2 << 30))},
		CPU:    &specs.LinuxCPU{Quota: ptr(int64(150000)), Period: ptr(uint64(100000))}}
	for _, tc := range []struct {
		name    string
		req     *sandboxAPI.UpdateSandboxRequest
		stopped bool
		want    *specs.LinuxResources // the VM's update; nil: none
		wantErr func(error) bool
	}{
		{name: "resize", req: resizeRequest(t, nil, "extensions"), want: resized},
		{name: "no fields named", req: resizeRequest(t, nil), want: resized},
		{name: "labels only", req: resizeRequest(t, nil, "labels")},
		{name: "no extension", req: &sandboxAPI.UpdateSandboxRequest{SandboxID: "sb1", Sandbox: &types.Sandbox{SandboxID: "sb1"}}},
		{name: "another type", req: resizeRequest(t, &anypb.Any{TypeUrl: "example.com/Other", Value: []byte("{}")}), wantErr: errdefs.IsInvalidArgument},
		{name: "not JSON", req: resizeRequest(t, &anypb.Any{TypeUrl: resizeTypeURL, Value: []byte("{")}), wantErr: errdefs.IsInvalidArgument},
		{name: "stopped", req: resizeRequest(t, nil), stopped: true, wantErr: errdefs.IsFailedPrecondition},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s, pods := runningSandbox(t, "sb1")
			if tc.stopped {
				if _, err := s.StopSandbox(ctx, &sandboxAPI.StopSandboxRequest{SandboxID: "sb1"}); err != nil {
					t.Fatal(err)
				}
			}
			_, err := s.UpdateSandbox(ctx, tc.req)
			if (tc.wantErr == nil) != (err == nil) || (err != nil && !tc.wantErr(err)) {
				t.Fatalf("update: %v", err)
			}
			var want []*specs.LinuxResources
			if tc.want != nil {
				want = append(want, tc.want)
			}
			if got, _ := json.Marshal(pods.pod.updates); string(got) != string(must(json.Marshal(want))) {
				t.Fatalf("the VM was updated with %s, want %s", got, must(json.Marshal(want)))
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}
