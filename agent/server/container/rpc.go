package container

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// RPC serves the agent API's container calls; the agent's service embeds
// it.
type RPC struct {
	m *Manager
}

// NewRPC serves m's containers.
func NewRPC(m *Manager) *RPC { return &RPC{m: m} }

// CreateContainer creates a container whose process waits for its start.
func (r *RPC) CreateContainer(ctx context.Context, req *api.CreateContainerRequest) (*api.ContainerProcessResponse, error) {
	c, err := r.m.Create(ctx, req.Id, CreateOptions{Spec: req.Spec, Rootfs: req.Rootfs, RootDisk: req.RootDisk, Files: req.Files, Volumes: req.VolumeDisks, Stdin: req.Stdin, OwnInit: req.OwnInit})
	if err != nil {
		return nil, err
	}
	return &api.ContainerProcessResponse{Pid: uint32(c.init.pid), Phases: c.Phases}, nil
}

// StartContainer starts a created container's process.
func (r *RPC) StartContainer(ctx context.Context, req *api.ContainerRequest) (*api.ContainerProcessResponse, error) {
	if req.ExecId != "" {
		return nil, fmt.Errorf("start %q of container %q: an exec starts with ExecContainer, expected no exec id: %w", req.ExecId, req.Id, errdefs.ErrInvalidArgument)
	}
	c, err := r.m.Get(req.Id)
	if err != nil {
		return nil, err
	}
	pid, err := c.Start(ctx)
	if err != nil {
		return nil, err
	}
	return &api.ContainerProcessResponse{Pid: uint32(pid)}, nil
}

// DeleteContainer removes a container, or forgets one of its execs.
func (r *RPC) DeleteContainer(ctx context.Context, req *api.ContainerRequest) (*emptypb.Empty, error) {
	if req.ExecId == "" {
		return empty(r.m.Delete(ctx, req.Id))
	}
	c, err := r.m.Get(req.Id)
	if err != nil {
		return nil, err
	}
	return empty(c.DeleteExec(req.ExecId))
}

// UpdateContainer changes a container's resources.
func (r *RPC) UpdateContainer(ctx context.Context, req *api.UpdateContainerRequest) (*emptypb.Empty, error) {
	c, err := r.m.Get(req.Id)
	if err != nil {
		return nil, err
	}
	return empty(c.Update(ctx, req.Resources))
}

// ContainerStats reads a container's cgroup.
func (r *RPC) ContainerStats(ctx context.Context, req *api.ContainerRequest) (*api.ContainerStatsResponse, error) {
	c, err := r.m.Get(req.Id)
	if err != nil {
		return nil, err
	}
	m, err := cgroupStats(c.cgroup)
	if err != nil {
		return nil, fmt.Errorf("stats of container %q: %w", req.Id, err)
	}
	return &api.ContainerStatsResponse{Metrics: m}, nil
}

// ExecContainer runs a process in a running container.
func (r *RPC) ExecContainer(ctx context.Context, req *api.ExecContainerRequest) (*api.ContainerProcessResponse, error) {
	c, err := r.m.Get(req.Id)
	if err != nil {
		return nil, err
	}
	pid, err := c.Exec(ctx, req.ExecId, ExecOptions{Process: req.Process, Stdin: req.Stdin})
	if err != nil {
		return nil, err
	}
	return &api.ContainerProcessResponse{Pid: uint32(pid)}, nil
}

// SignalContainer signals a container's process or one of its execs.
func (r *RPC) SignalContainer(ctx context.Context, req *api.SignalContainerRequest) (*emptypb.Empty, error) {
	if req.Signal == 0 || req.Signal > 64 {
		return nil, fmt.Errorf("signal %d: expected 1..64: %w", req.Signal, errdefs.ErrInvalidArgument)
	}
	c, err := r.m.Get(req.Id)
	if err != nil {
		return nil, err
	}
	return empty(c.Signal(ctx, req.ExecId, syscall.Signal(req.Signal), req.All))
}

// WaitContainer waits for a container's process or one of its execs.
func (r *RPC) WaitContainer(ctx context.Context, req *api.ContainerRequest) (*api.ContainerExit, error) {
	c, err := r.m.Get(req.Id)
	if err != nil {
		return nil, err
	}
	e, err := c.Wait(ctx, req.ExecId)
	if err != nil {
		return nil, err
	}
	return &api.ContainerExit{ExitCode: int32(e.Code), Signal: int32(e.Signal), ExitedAt: timestamppb.New(e.At), OomKilled: e.OOMKilled}, nil
}

// process finds the process a request names.
func (r *RPC) process(id, execID string) (*proc, error) {
	c, err := r.m.Get(id)
	if err != nil {
		return nil, err
	}
	return c.process(execID)
}

// ReadContainerOutput returns the next bytes of a process's stdout or stderr.
func (r *RPC) ReadContainerOutput(ctx context.Context, req *api.ReadContainerOutputRequest) (*api.ReadOutputResponse, error) {
	p, err := r.process(req.Id, req.ExecId)
	if err != nil {
		return nil, err
	}
	s := p.io.stdout
	if req.Stream == api.Stream_STDERR {
		if s = p.io.stderr; s == nil {
			return nil, fmt.Errorf("process %q has a terminal, its output is all on stdout: %w", p.id, errdefs.ErrFailedPrecondition)
		}
	}
	data, eof, err := s.Read(ctx, int(req.MaxBytes))
	if err != nil {
		return nil, fmt.Errorf("read %s of %q: %w", req.Stream, p.id, err)
	}
	return &api.ReadOutputResponse{Data: data, Eof: eof}, nil
}

// WriteContainerStdin writes to a process's stdin.
func (r *RPC) WriteContainerStdin(ctx context.Context, req *api.WriteContainerStdinRequest) (*emptypb.Empty, error) {
	p, err := r.process(req.Id, req.ExecId)
	if err != nil {
		return nil, err
	}
	return empty(stdioError(p, p.io.write(ctx, req.Data)))
}

// CloseContainerStdin ends a process's stdin.
func (r *RPC) CloseContainerStdin(ctx context.Context, req *api.ContainerRequest) (*emptypb.Empty, error) {
	p, err := r.process(req.Id, req.ExecId)
	if err != nil {
		return nil, err
	}
	return empty(stdioError(p, p.io.closeStdin()))
}

// ResizeContainerPty sets the window size of a process's terminal.
func (r *RPC) ResizeContainerPty(ctx context.Context, req *api.ResizeContainerPtyRequest) (*emptypb.Empty, error) {
	if req.Width == 0 || req.Height == 0 || req.Width > 0xffff || req.Height > 0xffff {
		return nil, fmt.Errorf("pty size %dx%d: expected 1..65535 columns and rows: %w", req.Width, req.Height, errdefs.ErrInvalidArgument)
	}
	p, err := r.process(req.Id, req.ExecId)
	if err != nil {
		return nil, err
	}
	return empty(stdioError(p, p.io.resize(req.Width, req.Height)))
}

// stdioError classes a stdio call's error.
func stdioError(p *proc, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errNoStdin), errors.Is(err, errNoTerminal):
		return fmt.Errorf("process %q: %w: %w", p.id, err, errdefs.ErrFailedPrecondition)
	}
	return fmt.Errorf("process %q: %w", p.id, err)
}

// empty is the reply of a call that answers nothing but its error.
func empty(err error) (*emptypb.Empty, error) {
	if err != nil {
		return nil, err
	}
	return &emptypb.Empty{}, nil
}
