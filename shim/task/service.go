// Package task is cocoon's containerd task service (task API v3): each task
// is a VM restored from a snapshot chain, its processes run in the guest
// through the agent, and the task's pid is the hypervisor's.
//
// The VM and the agent sit behind the small Launcher, VM and Guest
// interfaces, so the service is tested with fakes; errors become gRPC
// status errors only at the RPC methods.
package task

import (
	"context"
	"fmt"
	"os"
	"path"
	"sync"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/containerd/v2/core/runtime"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	ptypes "github.com/containerd/containerd/v2/pkg/protobuf/types"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/rpcerr"
)

var (
	_     taskAPI.TTRPCTaskService      = (*Service)(nil)
	_     shim.TTRPCService             = (*Service)(nil)
	_     shim.TTRPCServerUnaryOptioner = (*Service)(nil)
	empty                               = &ptypes.Empty{}
)

// Service implements the task API for cocoon VMs.
type Service struct {
	ctx       context.Context
	namespace string
	// containerd is containerd's gRPC address, for what tasks stage
	// through its API (a base image).
	containerd string
	launcher   Launcher
	events     chan any
	sd         shutdown.Service
	// draining tells the forwarder to publish what is queued and stop;
	// forwarded is closed once it has.
	draining, forwarded chan struct{}

	mu       sync.Mutex
	tasks    map[string]*task
	creating map[string]struct{} // ids whose Create (or StartPod) is in flight
	// pods are the pod VMs of containerd's sandbox API, by sandbox id.
	pods map[string]*PodVM
}

// NewService returns the task service; events go to publisher in the order
// the service queues them.
func NewService(ctx context.Context, launcher Launcher, publisher events.Publisher, sd shutdown.Service) *Service {
	ns, _ := namespaces.Namespace(ctx)
	s := &Service{
		ctx:       ctx,
		namespace: ns,
		launcher:  launcher,
		events:    make(chan any, 128),
		sd:        sd,
		draining:  make(chan struct{}),
		forwarded: make(chan struct{}),
		tasks:     map[string]*task{},
		creating:  map[string]struct{}{},
		pods:      map[string]*PodVM{},
	}
	go s.forward(publisher)
	sd.RegisterCallback(s.shutdown)
	if w, ok := launcher.(Warmer); ok {
		w.Warm(ctx)
	}
	return s
}

// RegisterTTRPC serves the task API on server: v3, and v2's clean-up.
func (s *Service) RegisterTTRPC(server *ttrpc.Server) error {
	taskAPI.RegisterTTRPCTaskService(server, s)
	s.registerV2(server)
	return nil
}

func (s *Service) send(evt any) {
	select {
	case s.events <- evt:
	case <-s.sd.Done():
	}
}

// forward publishes queued events in order; once draining, it publishes
// what is queued and returns.
func (s *Service) forward(publisher events.Publisher) {
	defer close(s.forwarded)
	ctx := context.WithoutCancel(s.ctx)
	publish := func(e any) {
		if err := publisher.Publish(ctx, runtime.GetTopic(e), e); err != nil {
			log.G(ctx).WithError(err).Error("publish event")
		}
	}
	for {
		select {
		case e := <-s.events:
			publish(e)
		case <-s.draining:
			for {
				select {
				case e := <-s.events:
					publish(e)
				default:
					if c, ok := publisher.(interface{ Close() error }); ok {
						c.Close()
					}
					return
				}
			}
		}
	}
}

// shutdown, the shim's shutdown callback, kills every VM still held, lets
// the launcher's own work settle (Settler), then has the forwarder publish
// every event queued before it returns: the shim's process ends once the
// callbacks have, and an event still queued then (the last task's exit or
// delete) would be lost.
func (s *Service) shutdown(ctx context.Context) error {
	err := s.destroyAll(ctx)
	if st, ok := s.launcher.(Settler); ok {
		st.Settle(ctx)
	}
	close(s.draining)
	select {
	case <-s.forwarded:
	case <-ctx.Done():
	}
	return err
}

// destroyAll kills every VM still held when the shim shuts down, so none
// outlives it; pod VMs are removed with all they hold. All are killed first, then their init exits are awaited
// together, within ctx and exitTimeout.
func (s *Service) destroyAll(ctx context.Context) error {
	s.mu.Lock()
	tasks := make([]*task, 0, len(s.tasks))
	for _, t := range s.tasks {
		tasks = append(tasks, t)
	}
	pods := make([]*PodVM, 0, len(s.pods))
	for _, p := range s.pods {
		pods = append(pods, p)
	}
	s.mu.Unlock()
	for _, t := range tasks {
		t.killVM("shim shutting down")
	}
	for _, p := range pods {
		if err := s.RemovePod(ctx, p); err != nil {
			log.G(ctx).WithError(err).WithField("id", p.id).Warn("remove pod VM at shutdown")
		}
	}
	wctx, cancel := context.WithTimeout(ctx, exitTimeout)
	defer cancel()
	for _, t := range tasks {
		// Let the init exit reach the task record before the shim exits.
		select {
		case <-t.init.done:
		case <-wctx.Done():
		}
		if err := t.sb.VM.Close(); err != nil {
			log.G(ctx).WithError(err).WithField("id", t.id).Warn("close VM at shutdown")
		}
	}
	return nil
}

func (s *Service) getTask(id string) (*task, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tasks[id]
	if !ok {
		return nil, fmt.Errorf("task %s: %w", id, errdefs.ErrNotFound)
	}
	return t, nil
}

func (s *Service) getProcess(id, execID string) (*task, *process, error) {
	t, err := s.getTask(id)
	if err != nil {
		return nil, nil, err
	}
	p, err := t.process(execID)
	if err != nil {
		return nil, nil, err
	}
	return t, p, nil
}

// Connect returns the shim's and the task's pids.
func (s *Service) Connect(ctx context.Context, r *taskAPI.ConnectRequest) (*taskAPI.ConnectResponse, error) {
	resp := &taskAPI.ConnectResponse{ShimPid: uint32(os.Getpid())}
	if t, err := s.getTask(r.ID); err == nil {
		resp.TaskPid = uint32(t.pid())
	}
	return resp, nil
}

// Shutdown stops the shim once it serves no task and no pod VM.
func (s *Service) Shutdown(ctx context.Context, r *taskAPI.ShutdownRequest) (*ptypes.Empty, error) {
	s.shutdownIfIdle()
	return empty, nil
}

// shutdownIfIdle stops the shim if it serves no task and no pod VM.
func (s *Service) shutdownIfIdle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.tasks) > 0 || len(s.creating) > 0 || len(s.pods) > 0 {
		return
	}
	s.sd.Shutdown()
}

// UnaryServerInterceptor is where every task API error becomes a gRPC
// status, for pkg/shim's ttrpc server: the methods return native errors.
// A Create never answers Unimplemented, which containerd takes for "task
// API v3 not served" (see rpcerr.Refusal), whatever slips through.
func (s *Service) UnaryServerInterceptor() ttrpc.UnaryServerInterceptor {
	return func(ctx context.Context, unmarshal ttrpc.Unmarshaler, info *ttrpc.UnaryServerInfo, method ttrpc.Method) (any, error) {
		resp, err := method(ctx, unmarshal)
		if path.Base(info.FullMethod) == "Create" {
			return resp, rpcerr.Refusal(err)
		}
		return resp, rpcerr.ToGRPC(err)
	}
}
