package server

import (
	"context"
	"fmt"
	"syscall"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// Exec starts a process and returns its pid. Processes outlive the
// connection that started them.
// With a container root from Init, they run inside it.
func (s *Service) Exec(ctx context.Context, r *api.ExecRequest) (*api.ExecResponse, error) {
	p, err := s.addProcess(r, false)
	if err != nil {
		return nil, err
	}
	return s.started(ctx, p), nil
}

// Start starts the process Init prepared.
func (s *Service) Start(ctx context.Context, r *api.ProcessRequest) (*api.ExecResponse, error) {
	p, err := s.process(r.Id)
	if err != nil {
		return nil, err
	}
	if err := p.start(); err != nil {
		return nil, err
	}
	return s.started(ctx, p), nil
}

// prepare readies Init's process for Start: checked now, forked and exec'd
// while Init's answer goes to the host, and held before its first
// instruction. What only the fork can find wrong fails Start.
func (s *Service) prepare(r *api.ExecRequest) error {
	if r == nil {
		return nil
	}
	_, err := s.addProcess(r, true)
	return err
}

// addProcess checks r and adds its process: started now, or held for
// Start.
func (s *Service) addProcess(r *api.ExecRequest, hold bool) (*process, error) {
	spec, err := newProcSpec(r, s.containerRoot(), s.boot.Load())
	if err != nil {
		return nil, err
	}
	if g := s.guestRoot.Load(); g != nil && spec.root == "" {
		spec.mountNS = g.ns
	}
	if err := s.reserve(r.Id); err != nil {
		return nil, err
	}
	// A process may configure the NIC and change the guest's files.
	s.nicDown.Store(false)
	s.boot.Store(nil)
	p, err := prepareProcess(r.Id, spec, r.Terminal, r.Stdin, hold)
	if err == nil && !hold {
		err = p.start()
	}
	s.mu.Lock()
	if err != nil {
		delete(s.procs, r.Id)
	} else {
		s.procs[r.Id] = p
	}
	s.mu.Unlock()
	return p, err
}

func (s *Service) started(ctx context.Context, p *process) *api.ExecResponse {
	pid := p.pid()
	if debugging() {
		log.G(ctx).WithField("id", p.id).WithField("pid", pid).Debug("process started")
	}
	return &api.ExecResponse{Pid: uint32(pid)}
}

// reserve claims id for a process being started, which may take a while
// (its exec) and must not hold up calls about other processes.
func (s *Service) reserve(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.procs[id]; ok {
		return fmt.Errorf("process %q: %w", id, errdefs.ErrAlreadyExists)
	}
	s.procs[id] = nil
	return nil
}

// process returns the started process id; one still starting is NotFound.
func (s *Service) process(id string) (*process, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.procs[id]
	if p == nil {
		return nil, fmt.Errorf("process %q: %w", id, errdefs.ErrNotFound)
	}
	return p, nil
}

// ReadOutput returns the next bytes of a process's stdout or stderr.
func (s *Service) ReadOutput(ctx context.Context, r *api.ReadOutputRequest) (*api.ReadOutputResponse, error) {
	p, err := s.process(r.Id)
	if err != nil {
		return nil, err
	}
	out := p.stdout
	if r.Stream == api.Stream_STDERR {
		if p.terminal {
			return nil, fmt.Errorf("process %q has a terminal, its output is all on stdout: %w", r.Id, errdefs.ErrFailedPrecondition)
		}
		out = p.stderr
	}
	data, eof, err := out.Read(ctx, int(r.MaxBytes))
	if err != nil {
		return nil, fmt.Errorf("read %s of %q: %w", r.Stream, r.Id, err)
	}
	return &api.ReadOutputResponse{Data: data, Eof: eof}, nil
}

// WriteStdin writes to a process's stdin.
func (s *Service) WriteStdin(ctx context.Context, r *api.WriteStdinRequest) (*emptypb.Empty, error) {
	p, err := s.process(r.Id)
	if err != nil {
		return nil, err
	}
	if err := p.writeStdin(ctx, r.Data); err != nil {
		return nil, err
	}
	return &emptypb.Empty{}, nil
}

// CloseStdin ends a process's stdin.
func (s *Service) CloseStdin(ctx context.Context, r *api.ProcessRequest) (*emptypb.Empty, error) {
	p, err := s.process(r.Id)
	if err != nil {
		return nil, err
	}
	if err := p.closeStdin(); err != nil {
		return nil, err
	}
	return &emptypb.Empty{}, nil
}

// Wait blocks until a process exits and returns how.
func (s *Service) Wait(ctx context.Context, r *api.ProcessRequest) (*api.WaitResponse, error) {
	p, err := s.process(r.Id)
	if err != nil {
		return nil, err
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for %q: %w", r.Id, ctx.Err())
	}
	return &api.WaitResponse{
		ExitCode: int32(p.status.code),
		Signal:   int32(p.status.signal),
		ExitedAt: timestamppb.New(p.status.at),
	}, nil
}

// Signal sends a signal to a running process; one that has exited is
// NotFound.
func (s *Service) Signal(ctx context.Context, r *api.SignalRequest) (*emptypb.Empty, error) {
	if r.Signal == 0 || r.Signal > 64 {
		return nil, fmt.Errorf("signal %d: expected 1..64: %w", r.Signal, errdefs.ErrInvalidArgument)
	}
	p, err := s.process(r.Id)
	if err != nil {
		return nil, err
	}
	if err := p.signal(syscall.Signal(r.Signal)); err != nil {
		return nil, err
	}
	return &emptypb.Empty{}, nil
}

// ResizePty sets the window size of a terminal process.
func (s *Service) ResizePty(ctx context.Context, r *api.ResizePtyRequest) (*emptypb.Empty, error) {
	if r.Width == 0 || r.Height == 0 || r.Width > 0xffff || r.Height > 0xffff {
		return nil, fmt.Errorf("pty size %dx%d: expected 1..65535 columns and rows: %w", r.Width, r.Height, errdefs.ErrInvalidArgument)
	}
	p, err := s.process(r.Id)
	if err != nil {
		return nil, err
	}
	if err := p.resize(r.Width, r.Height); err != nil {
		return nil, err
	}
	return &emptypb.Empty{}, nil
}

// Delete forgets an exited process and closes its streams; a process
// prepared but never started is given up.
func (s *Service) Delete(ctx context.Context, r *api.ProcessRequest) (*emptypb.Empty, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.procs[r.Id]
	if p == nil {
		return nil, fmt.Errorf("process %q: %w", r.Id, errdefs.ErrNotFound)
	}
	if !p.discard() && !p.exited() {
		return nil, fmt.Errorf("process %q is still running: %w", r.Id, errdefs.ErrFailedPrecondition)
	}
	delete(s.procs, r.Id)
	p.closeParentEnds()
	return &emptypb.Empty{}, nil
}
