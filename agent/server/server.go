// Package server is the guest side of the agent API: it runs inside the VM
// as part of cocoon-agent and starts and tracks the guest's processes.
package server

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// Version is reported by Ping.
const Version = "1"

// shutdownGrace lets the Shutdown reply leave before the power goes.
const shutdownGrace = 50 * time.Millisecond

// Service implements api.AgentService.
type Service struct {
	sys System

	mu    sync.Mutex
	procs map[string]*process
}

var _ api.AgentService = (*Service)(nil)

// New returns a service that changes the machine through sys.
func New(sys System) *Service {
	return &Service{sys: sys, procs: map[string]*process{}}
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

// Init gives the guest its clone identity, and detaches the processes it
// inherited from its snapshot (detachAll).
func (s *Service) Init(ctx context.Context, r *api.InitRequest) (*emptypb.Empty, error) {
	if r.Time != nil {
		if err := r.Time.CheckValid(); err != nil {
			return nil, fmt.Errorf("init time: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		if err := s.sys.SetTime(r.Time.AsTime()); err != nil {
			return nil, err
		}
	}
	if len(r.Entropy) > 0 {
		if err := s.sys.AddEntropy(r.Entropy); err != nil {
			return nil, err
		}
	}
	if r.Hostname != "" {
		if err := s.sys.SetHostname(r.Hostname); err != nil {
			return nil, err
		}
	}
	s.detachAll()
	log.G(ctx).WithField("hostname", r.Hostname).WithField("entropy", len(r.Entropy)).Info("guest initialized")
	return &emptypb.Empty{}, nil
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
