// Package server is the guest side of the agent API: it runs inside the VM
// as part of cocoon-agent and starts and tracks the guest's processes.
package server

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/server/container"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/server/ports"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/server/shares"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/rpcerr"
)

// Version is reported by Ping and Init. 2: Init carries files, network
// and rootfs; Exec carries rlimits, umask and no_new_privileges. 3: Init
// prepares a process that Start starts, and answers with the version. 4:
// the container calls (runc in the guest). 5: Exec's own_pid_namespace.
// 6: Init's sysctls. 7: the port calls and UpdateFiles. 8: UpdateFiles
// takes files in pieces; a directory may be a tmpfs (File.tmpfs_size).
// 9: the share calls. 10: Exec's seccomp filter; a Rootfs without a
// disk confines the guest's own root. 11: Init's warm_containers. 12: the
// guest's own pause process (agent/pause.Path). 13: a disk's size
// (Rootfs.size, VolumeDisk.size): a slot probed at boot is refreshed, not
// probed again. 14: CreateContainer's own_init (agent/cinit). 15: the
// pause is cocoon-pause, which exits at once given pause.WarmFlag.
const Version = "15"

// shutdownGrace lets the Shutdown reply leave before the power goes.
const shutdownGrace = 50 * time.Millisecond

// DefaultStateDir is where the agent mounts a container's root and keeps
// what it must remember across its own restarts (tmpfs, per boot).
const DefaultStateDir = "/run/cocoon"

// Service implements api.AgentService.
type Service struct {
	*container.RPC // the container calls
	*ports.Conns   // the port calls
	*shares.Shares // the share calls

	sys      System
	net      Network // nil: the agent manages no NIC
	mnt      Mounter // nil: the agent mounts no rootfs
	stateDir string

	initMu sync.Mutex // one Init at a time
	// nicDown says the NIC is down with no addresses or routes, as Init
	// without a network leaves it: no process ran since, which might
	// have configured it.
	nicDown atomic.Bool
	// boot is the guest's root as its boot left it, while nothing can
	// have changed what it holds; nil otherwise.
	boot atomic.Pointer[bootRoot]
	// rootMounted says Init mounted the container's root.
	rootMounted atomic.Bool
	// guestRoot is where a snapshot image's processes run when Init
	// confined the guest's root; nil: the agent's namespace.
	guestRoot atomic.Pointer[guestRoot]

	mu    sync.Mutex
	procs map[string]*process
}

var _ api.AgentService = (*Service)(nil)

// Option configures a Service.
type Option func(*Service)

// WithNetwork lets Init configure the guest's NIC through n. Without it an
// Init that carries a network fails, and one that carries none does
// nothing to the network.
func WithNetwork(n Network) Option { return func(s *Service) { s.net = n } }

// WithMounter lets Init mount a container rootfs through m. Without it an
// Init that carries a rootfs fails.
func WithMounter(m Mounter) Option { return func(s *Service) { s.mnt = m } }

// WithFreshBoot says the guest is as its boot left it: the agent starts
// for the first time since. Its NIC is down and bare, so Init without a
// network has nothing to undo; and the agent reads the guest's root now
// (see bootRoot).
func WithFreshBoot() Option {
	return func(s *Service) {
		s.nicDown.Store(true)
		s.boot.Store(readBootRoot())
	}
}

// WithStateDir moves the agent's state (DefaultStateDir).
func WithStateDir(dir string) Option { return func(s *Service) { s.stateDir = dir } }

// New returns a service that changes the machine through sys and the
// seams opts add; tests pass fakes, cocoon-agent the real ones.
func New(sys System, opts ...Option) *Service {
	s := &Service{sys: sys, stateDir: DefaultStateDir, procs: map[string]*process{}}
	for _, o := range opts {
		o(s)
	}
	cfg := container.DefaultConfig
	if s.mnt != nil {
		cfg.Roots = containerRoots{s}
	}
	s.RPC = container.NewRPC(container.New(cfg))
	s.Conns = ports.New()
	s.Shares = shares.New(filepath.Join(s.stateDir, bindCopies))
	s.findRootfs()
	return s
}

// NewTTRPCServer returns a ttrpc server serving s. Errors reach the host as
// status codes that errgrpc.ToNative turns back into errdefs errors. The
// forkers and the API's message codecs are made now (see warmUp).
func NewTTRPCServer(s *Service) (*ttrpc.Server, error) {
	warmUp()
	srv, err := ttrpc.NewServer(ttrpc.WithUnaryServerInterceptor(statusErrors))
	if err != nil {
		return nil, fmt.Errorf("create ttrpc server: %w", err)
	}
	api.RegisterAgentService(srv, s)
	return srv, nil
}

// debugging says whether debug logs are written: a restored clone's calls
// on its way to the process skip building the ones that are not, code its
// CPU would translate anew.
func debugging() bool { return log.GetLevel() >= log.DebugLevel }

// statusErrors turns a call's error into a status ttrpc can send, and a
// reply too large to send into an error (see maxReply).
func statusErrors(ctx context.Context, unmarshal ttrpc.Unmarshaler, info *ttrpc.UnaryServerInfo, method ttrpc.Method) (any, error) {
	resp, err := method(ctx, unmarshal)
	if err == nil {
		if err = boundReply(info.FullMethod, resp); err != nil {
			log.G(ctx).WithError(err).Warn("agent reply refused")
		}
	}
	if err != nil {
		log.G(ctx).WithError(err).WithField("method", info.FullMethod).Debug("agent call failed")
		return nil, sendableError(rpcerr.ToGRPC(err))
	}
	return resp, nil
}

// Ping answers with the agent version and kernel release.
func (s *Service) Ping(ctx context.Context, _ *emptypb.Empty) (*api.PingResponse, error) {
	return &api.PingResponse{Version: Version, KernelRelease: s.sys.KernelRelease()}, nil
}

// Shutdown syncs and then powers the guest off, after the reply is sent.
func (s *Service) Shutdown(ctx context.Context, _ *emptypb.Empty) (*emptypb.Empty, error) {
	s.sys.Sync()
	time.AfterFunc(shutdownGrace, func() {
		if err := s.sys.PowerOff(); err != nil {
			log.L.WithError(err).Error("power off")
		}
	})
	return &emptypb.Empty{}, nil
}
