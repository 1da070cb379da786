package sandboxapi

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	sandboxAPI "github.com/containerd/containerd/api/runtime/sandbox/v1"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
)

// The states SandboxStatus reports, CRI's names for them.
const (
	stateReady    = "SANDBOX_READY"
	stateNotReady = "SANDBOX_NOTREADY"
)

// Exit statuses WaitSandbox reports: a VM the sandbox API stopped ended
// as asked; one that ended on its own is reported as containerd reports a
// shim it lost.
const (
	exitStopped = 0
	exitLost    = 255
)

// cocoonAnnotations is the prefix of the pod annotations the pod's VM
// gets (the restore mode); the runtime config says whether it heeds them.
const cocoonAnnotations = "io.cocoon."

// sandbox is one pod: created, then started (its VM runs), then stopped.
type sandbox struct {
	id, bundle             string
	spec                   *specs.Spec
	config                 *runtime.PodSandboxConfig
	hostname               string
	configPath, configBody string
	created                time.Time

	mu       sync.Mutex
	starting bool
	pod      Pod // nil until started
	stopped  bool
	stopAt   time.Time
	// ended is closed once the VM has exited, or at a stop when it never
	// ran.
	ended   chan struct{}
	endOnce sync.Once
}

// newSandbox reads a CreateSandbox request: the pod config CRI sends as
// its options, and the pod's network namespace.
func newSandbox(r *sandboxAPI.CreateSandboxRequest) (*sandbox, error) {
	if r.SandboxID == "" || r.BundlePath == "" {
		return nil, fmt.Errorf("create sandbox: no id or bundle: %w", errdefs.ErrInvalidArgument)
	}
	cfg := &runtime.PodSandboxConfig{}
	if r.Options != nil && len(r.Options.GetValue()) > 0 {
		v, err := typeurl.UnmarshalAny(r.Options)
		if err != nil {
			return nil, fmt.Errorf("decode the options of sandbox %s: %w: %w", r.SandboxID, err, errdefs.ErrInvalidArgument)
		}
		var ok bool
		if cfg, ok = v.(*runtime.PodSandboxConfig); !ok {
			return nil, fmt.Errorf("the options of sandbox %s are %T, want CRI's PodSandboxConfig: %w", r.SandboxID, v, errdefs.ErrInvalidArgument)
		}
	}
	if err := refuseHostNamespaces(r.SandboxID, cfg); err != nil {
		return nil, err
	}
	return &sandbox{
		id: r.SandboxID, bundle: r.BundlePath, hostname: cfg.GetHostname(), config: cfg,
		spec:    podSpec(r.SandboxID, r.NetnsPath, cfg),
		created: time.Now(),
		ended:   make(chan struct{}),
	}, nil
}

// podSpec is the OCI spec a pod's VM is launched with: the pod's network
// namespace, its cgroup (CRI's path for a sandbox: the pod's cgroup parent
// and the sandbox id), its resources, its sysctls and its cocoon
// annotations.
func podSpec(id, netns string, cfg *runtime.PodSandboxConfig) *specs.Spec {
	spec := &specs.Spec{Version: specs.Version, Hostname: cfg.GetHostname(), Annotations: map[string]string{}, Linux: &specs.Linux{}}
	for k, v := range cfg.GetAnnotations() {
		if strings.HasPrefix(k, cocoonAnnotations) {
			spec.Annotations[k] = v
		}
	}
	if netns != "" {
		spec.Linux.Namespaces = []specs.LinuxNamespace{{Type: specs.NetworkNamespace, Path: netns}}
	}
	linux := cfg.GetLinux()
	if parent := linux.GetCgroupParent(); parent != "" {
		spec.Linux.CgroupsPath = filepath.Join(parent, id)
	}
	spec.Linux.Resources = podResources(linux.GetResources())
	spec.Linux.Sysctl = linux.GetSysctls()
	return spec
}

// refuseHostNamespaces fails a pod that asks for a namespace of the
// host's, which its VM cannot join.
func refuseHostNamespaces(id string, cfg *runtime.PodSandboxConfig) error {
	ns := cfg.GetLinux().GetSecurityContext().GetNamespaceOptions()
	for _, o := range []struct {
		field string
		mode  runtime.NamespaceMode
	}{{"hostNetwork", ns.GetNetwork()}, {"hostIPC", ns.GetIpc()}, {"hostPID", ns.GetPid()}} {
		if o.mode == runtime.NamespaceMode_NODE {
			return task.HostNamespaceError(id, o.field)
		}
	}
	return nil
}

// podResources are the pod-level limits CRI may give a sandbox.
func podResources(r *runtime.LinuxContainerResources) *specs.LinuxResources {
	if r == nil {
		return nil
	}
	res := &specs.LinuxResources{}
	if r.MemoryLimitInBytes > 0 {
		res.Memory = &specs.LinuxMemory{Limit: &r.MemoryLimitInBytes}
	}
	cpu := &specs.LinuxCPU{Cpus: r.CpusetCpus, Mems: r.CpusetMems}
	if r.CpuShares > 0 {
		shares := uint64(r.CpuShares)
		cpu.Shares = &shares
	}
	if r.CpuQuota > 0 {
		cpu.Quota = &r.CpuQuota
	}
	if r.CpuPeriod > 0 {
		period := uint64(r.CpuPeriod)
		cpu.Period = &period
	}
	if cpu.Shares != nil || cpu.Quota != nil || cpu.Period != nil || cpu.Cpus != "" || cpu.Mems != "" {
		res.CPU = cpu
	}
	return res
}

// start restores the pod's VM, once.
func (sb *sandbox) start(ctx context.Context, pods Pods) (Pod, error) {
	sb.mu.Lock()
	switch {
	case sb.pod != nil || sb.starting:
		sb.mu.Unlock()
		return nil, fmt.Errorf("sandbox %s is started already: %w", sb.id, errdefs.ErrAlreadyExists)
	case sb.stopped:
		sb.mu.Unlock()
		return nil, fmt.Errorf("sandbox %s is stopped: %w", sb.id, errdefs.ErrFailedPrecondition)
	}
	sb.starting = true
	sb.mu.Unlock()
	p, err := pods.StartPod(ctx, task.LaunchRequest{
		ID: sb.id, Bundle: sb.bundle, Spec: sb.spec, Hostname: sb.hostname, Sysctls: sb.spec.Linux.Sysctl,
		ConfigPath: sb.configPath, ConfigBody: sb.configBody,
	})
	sb.mu.Lock()
	defer sb.mu.Unlock()
	sb.starting = false
	if err != nil {
		return nil, err
	}
	sb.pod = p
	go func() {
		<-p.Done()
		sb.end()
	}()
	return p, nil
}

func (sb *sandbox) end() { sb.endOnce.Do(func() { close(sb.ended) }) }

func (sb *sandbox) exited() <-chan struct{} { return sb.ended }

// stop kills the pod's VM if it runs; a sandbox never started just ends.
func (sb *sandbox) stop(ctx context.Context, pods Pods) error {
	sb.mu.Lock()
	if sb.starting {
		sb.mu.Unlock()
		return fmt.Errorf("sandbox %s is starting: %w", sb.id, errdefs.ErrUnavailable)
	}
	if !sb.stopped {
		sb.stopped, sb.stopAt = true, time.Now()
	}
	p := sb.pod
	sb.mu.Unlock()
	if p == nil {
		sb.end()
		return nil
	}
	return pods.StopPod(ctx, p)
}

// remove stops the sandbox and releases everything of it.
func (sb *sandbox) remove(ctx context.Context, pods Pods) error {
	if err := sb.stop(ctx, pods); err != nil {
		return err
	}
	sb.mu.Lock()
	p := sb.pod
	sb.mu.Unlock()
	if p == nil {
		return nil
	}
	return pods.RemovePod(ctx, p)
}

// running is the pod's VM while it runs and no stop was asked.
func (sb *sandbox) running() (Pod, error) {
	sb.mu.Lock()
	p, stopped := sb.pod, sb.stopped
	sb.mu.Unlock()
	if stopped || sb.status().state != stateReady {
		return nil, fmt.Errorf("sandbox %s is not running: %w", sb.id, errdefs.ErrFailedPrecondition)
	}
	return p, nil
}

type status struct {
	state    string
	pid      uint32
	exitedAt time.Time
}

func (sb *sandbox) status() status {
	sb.mu.Lock()
	p := sb.pod
	sb.mu.Unlock()
	select {
	case <-sb.ended:
		_, at := sb.exit()
		st := status{state: stateNotReady, exitedAt: at}
		if p != nil {
			st.pid = uint32(p.PID())
		}
		return st
	default:
	}
	if p == nil {
		return status{state: stateNotReady}
	}
	return status{state: stateReady, pid: uint32(p.PID())}
}

// exit is how the ended sandbox ended: stopped as asked, or its VM lost.
func (sb *sandbox) exit() (uint32, time.Time) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	at := sb.stopAt
	if sb.pod != nil {
		at = sb.pod.ExitedAt()
	}
	if sb.stopped {
		return exitStopped, at
	}
	return exitLost, at
}
