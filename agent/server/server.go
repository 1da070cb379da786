// Package server is the guest side of the agent API: it runs inside the VM
// as part of cocoon-agent and starts and tracks the guest's processes.
package server

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// Version is reported by Ping. 2: Init carries files, network and rootfs;
// Exec carries rlimits, umask and no_new_privileges.
const Version = "2"

// shutdownGrace lets the Shutdown reply leave before the power goes.
const shutdownGrace = 50 * time.Millisecond

// DefaultStateDir is where the agent mounts a container's root and keeps
// what it must remember across its own restarts (tmpfs, per boot).
const DefaultStateDir = "/run/cocoon"

// Service implements api.AgentService.
type Service struct {
	sys      System
	net      Network // nil: the agent manages no NIC
	mnt      Mounter // nil: the agent mounts no rootfs
	stateDir string

	initMu sync.Mutex // one Init at a time

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

// WithStateDir moves the agent's state (DefaultStateDir).
func WithStateDir(dir string) Option { return func(s *Service) { s.stateDir = dir } }

// New returns a service that changes the machine through sys and the
// seams opts add; tests pass fakes, cocoon-agent the real ones.
func New(sys System, opts ...Option) *Service {
	s := &Service{sys: sys, stateDir: DefaultStateDir, procs: map[string]*process{}}
	for _, o := range opts {
		o(s)
	}
	return s
}

// NewTTRPCServer returns a ttrpc server serving s. Errors reach the host as
// status codes that errgrpc.ToNative turns back into errdefs errors.
func NewTTRPCServer(s *Service) (*ttrpc.Server, error) {
	srv, err := ttrpc.NewServer(ttrpc.WithUnaryServerInterceptor(statusErrors))
	if err != nil {
		return nil, fmt.Errorf("create ttrpc server: %w", err)
	}
	api.RegisterAgentService(srv, s)
	return srv, nil
}

func statusErrors(ctx context.Context, unmarshal ttrpc.Unmarshaler, info *ttrpc.UnaryServerInfo, method ttrpc.Method) (any, error) {
	resp, err := method(ctx, unmarshal)
	if err != nil {
		log.G(ctx).WithError(err).WithField("method", info.FullMethod).Debug("agent call failed")
		return nil, errgrpc.ToGRPC(err)
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
