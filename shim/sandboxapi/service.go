// Package sandboxapi serves containerd's sandbox API (runtime/sandbox/v1
// SandboxService) next to the task service, for a CRI runtime handler with
// sandboxer = "shim": containerd starts the shim for the pod, asks it to
// create and start the sandbox (the pod's VM, restored from the runtime
// class's base snapshot, with no image of its own: no pause container),
// then sends the pod's containers as tasks to the same shim, where they
// join that VM. The VM itself is the task service's (task.PodVM); this
// package is the API's edge over it.
package sandboxapi

import (
	"context"
	"fmt"
	goruntime "runtime"
	"sync"
	"time"

	sandboxAPI "github.com/containerd/containerd/api/runtime/sandbox/v1"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
)

// Pod is a pod's running VM, as the sandbox API reports it.
type Pod interface {
	PID() int
	// Done is closed once the VM has exited, at ExitedAt.
	Done() <-chan struct{}
	ExitedAt() time.Time
	// Stats are the VM's cgroup metrics (cgroup v1 or v2 types).
	Stats() (any, error)
	// Update puts the pod's new limits on the VM's cgroup.
	Update(res *specs.LinuxResources) error
}

// Pods runs pod VMs: the task service, whose tasks join them.
type Pods interface {
	StartPod(ctx context.Context, r task.LaunchRequest) (Pod, error)
	// StopPod kills the pod's containers and its VM.
	StopPod(ctx context.Context, p Pod) error
	// RemovePod releases all the pod holds.
	RemovePod(ctx context.Context, p Pod) error
	// ShutdownIfIdle lets the shim exit if it serves nothing else.
	ShutdownIfIdle()
}

// replyGrace is how long the shim outlives a ShutdownSandbox: pkg/shim's
// server exits at once when told to, and containerd's sandbox controller,
// unlike its task manager, takes a connection closed before the answer for
// a failed shutdown.
const replyGrace = time.Second

// OptionsFunc finds the runtime options of sandbox id (its runtime
// handler's), which CreateSandbox does not carry.
type OptionsFunc func(ctx context.Context, id string) (typeurl.Any, error)

// Service implements SandboxService over Pods.
type Service struct {
	pods    Pods
	options OptionsFunc

	mu        sync.Mutex
	sandboxes map[string]*sandbox
}

var _ sandboxAPI.TTRPCSandboxService = (*Service)(nil)

// New returns the sandbox service; options may be nil when every sandbox
// runs with the shim's default config.
func New(pods Pods, options OptionsFunc) *Service {
	return &Service{pods: pods, options: options, sandboxes: map[string]*sandbox{}}
}

// RegisterTTRPC serves the sandbox API on server (pkg/shim's, which the
// task service shares, with its error interceptor).
func (s *Service) RegisterTTRPC(server *ttrpc.Server) error {
	sandboxAPI.RegisterTTRPCSandboxService(server, s)
	return nil
}

func (s *Service) get(id string) (*sandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[id]
	if !ok {
		return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return sb, nil
}

// CreateSandbox records the pod: its config, network namespace, bundle
// and runtime options. Nothing runs until StartSandbox.
func (s *Service) CreateSandbox(ctx context.Context, r *sandboxAPI.CreateSandboxRequest) (*sandboxAPI.CreateSandboxResponse, error) {
	if len(r.Rootfs) > 0 {
		return nil, fmt.Errorf("sandbox %s has a rootfs: a pod's VM restores the runtime class's base snapshot and takes no image: %w", r.SandboxID, errdefs.ErrInvalidArgument)
	}
	sb, err := newSandbox(r)
	if err != nil {
		return nil, err
	}
	if s.options != nil {
		opts, err := s.options(ctx, r.SandboxID)
		if err != nil {
			return nil, err
		}
		if sb.configPath, sb.configBody, err = task.RuntimeConfig(opts); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.sandboxes[r.SandboxID]; ok {
		return nil, fmt.Errorf("sandbox %s: %w", r.SandboxID, errdefs.ErrAlreadyExists)
	}
	s.sandboxes[r.SandboxID] = sb
	return &sandboxAPI.CreateSandboxResponse{}, nil
}

// StartSandbox restores the pod's VM.
func (s *Service) StartSandbox(ctx context.Context, r *sandboxAPI.StartSandboxRequest) (*sandboxAPI.StartSandboxResponse, error) {
	sb, err := s.get(r.SandboxID)
	if err != nil {
		return nil, err
	}
	p, err := sb.start(ctx, s.pods)
	if err != nil {
		return nil, err
	}
	spec, err := typeurl.MarshalAnyToProto(sb.spec)
	if err != nil {
		return nil, fmt.Errorf("encode the spec of sandbox %s: %w", r.SandboxID, err)
	}
	return &sandboxAPI.StartSandboxResponse{Pid: uint32(p.PID()), CreatedAt: timestamppb.New(sb.created), Spec: spec}, nil
}

// Platform is the guest's: Linux on the host's architecture.
func (s *Service) Platform(ctx context.Context, r *sandboxAPI.PlatformRequest) (*sandboxAPI.PlatformResponse, error) {
	if _, err := s.get(r.SandboxID); err != nil {
		return nil, err
	}
	return &sandboxAPI.PlatformResponse{Platform: &types.Platform{OS: "linux", Architecture: goruntime.GOARCH}}, nil
}

// StopSandbox kills the pod's containers and its VM.
func (s *Service) StopSandbox(ctx context.Context, r *sandboxAPI.StopSandboxRequest) (*sandboxAPI.StopSandboxResponse, error) {
	sb, err := s.get(r.SandboxID)
	if err != nil {
		return nil, err
	}
	if err := sb.stop(ctx, s.pods); err != nil {
		return nil, err
	}
	return &sandboxAPI.StopSandboxResponse{}, nil
}

// WaitSandbox returns once the pod's VM has exited (or was never started
// and is stopped).
func (s *Service) WaitSandbox(ctx context.Context, r *sandboxAPI.WaitSandboxRequest) (*sandboxAPI.WaitSandboxResponse, error) {
	sb, err := s.get(r.SandboxID)
	if err != nil {
		return nil, err
	}
	select {
	case <-sb.exited():
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	status, at := sb.exit()
	return &sandboxAPI.WaitSandboxResponse{ExitStatus: status, ExitedAt: timestamppb.New(at)}, nil
}

// SandboxStatus reports the pod's state, its VM's pid and its times.
func (s *Service) SandboxStatus(ctx context.Context, r *sandboxAPI.SandboxStatusRequest) (*sandboxAPI.SandboxStatusResponse, error) {
	sb, err := s.get(r.SandboxID)
	if err != nil {
		return nil, err
	}
	st := sb.status()
	resp := &sandboxAPI.SandboxStatusResponse{SandboxID: r.SandboxID, Pid: st.pid, State: st.state, CreatedAt: timestamppb.New(sb.created)}
	if !st.exitedAt.IsZero() {
		resp.ExitedAt = timestamppb.New(st.exitedAt)
	}
	if r.Verbose {
		if resp.Info, err = sb.info(st); err != nil {
			return nil, err
		}
	}
	return resp, nil
}

// PingSandbox answers for a sandbox this shim has.
func (s *Service) PingSandbox(ctx context.Context, r *sandboxAPI.PingRequest) (*sandboxAPI.PingResponse, error) {
	if _, err := s.get(r.SandboxID); err != nil {
		return nil, err
	}
	return &sandboxAPI.PingResponse{}, nil
}

// ShutdownSandbox removes everything of the pod; the shim exits soon after
// if it serves nothing else.
func (s *Service) ShutdownSandbox(ctx context.Context, r *sandboxAPI.ShutdownSandboxRequest) (*sandboxAPI.ShutdownSandboxResponse, error) {
	sb, err := s.get(r.SandboxID)
	if err != nil {
		return nil, err
	}
	if err := sb.remove(ctx, s.pods); err != nil {
		return nil, err
	}
	s.mu.Lock()
	delete(s.sandboxes, r.SandboxID)
	s.mu.Unlock()
	log.G(ctx).WithField("id", r.SandboxID).Info("sandbox shut down")
	time.AfterFunc(replyGrace, s.pods.ShutdownIfIdle)
	return &sandboxAPI.ShutdownSandboxResponse{}, nil
}

// SandboxMetrics are the pod VM's cgroup metrics.
func (s *Service) SandboxMetrics(ctx context.Context, r *sandboxAPI.SandboxMetricsRequest) (*sandboxAPI.SandboxMetricsResponse, error) {
	sb, err := s.get(r.SandboxID)
	if err != nil {
		return nil, err
	}
	p, err := sb.running()
	if err != nil {
		return nil, err
	}
	m, err := p.Stats()
	if err != nil {
		return nil, err
	}
	data, err := typeurl.MarshalAnyToProto(m)
	if err != nil {
		return nil, fmt.Errorf("encode the metrics of sandbox %s: %w", r.SandboxID, err)
	}
	return &sandboxAPI.SandboxMetricsResponse{Metrics: &types.Metric{Timestamp: timestamppb.Now(), ID: r.SandboxID, Data: data}}, nil
}

// UpdateSandbox applies an in-place resize of the pod (containerd's CRI
// sends UpdatePodSandboxResources here) to its VM's cgroup; an update that
// carries no resize changes nothing the shim holds.
func (s *Service) UpdateSandbox(ctx context.Context, r *sandboxAPI.UpdateSandboxRequest) (*sandboxAPI.UpdateSandboxResponse, error) {
	sb, err := s.get(r.SandboxID)
	if err != nil {
		return nil, err
	}
	res, err := resizeOf(r)
	if err != nil {
		return nil, err
	}
	if res == nil {
		return &sandboxAPI.UpdateSandboxResponse{}, nil
	}
	if err := sb.resize(res); err != nil {
		return nil, err
	}
	log.G(ctx).WithFields(log.Fields{"id": r.SandboxID, "memory": res.MemoryLimitInBytes, "cpu_quota": res.CpuQuota}).Info("sandbox resized")
	return &sandboxAPI.UpdateSandboxResponse{}, nil
}
