package task

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/pkg/protobuf"
	ptypes "github.com/containerd/containerd/v2/pkg/protobuf/types"
	"github.com/containerd/containerd/v2/pkg/stdio"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/launch"
)

// maxSignal is Linux's highest signal number (SIGRTMAX).
const maxSignal = 64

// Start runs the init process or an exec in the guest.
func (s *Service) Start(ctx context.Context, r *taskAPI.StartRequest) (*taskAPI.StartResponse, error) {
	t, p, err := s.getProcess(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	began := time.Now()
	if err := t.start(ctx, p); err != nil {
		return nil, err
	}
	if r.ExecID == "" {
		t.recordPhase(ctx, startedPhase, time.Since(began))
		if err := t.poststart(ctx); err != nil {
			return nil, err
		}
	}
	return &taskAPI.StartResponse{Pid: t.pidOf(p)}, nil
}

// Exec adds a process to the task's VM; it runs at Start.
func (s *Service) Exec(ctx context.Context, r *taskAPI.ExecProcessRequest) (*ptypes.Empty, error) {
	t, err := s.getTask(r.ID)
	if err != nil {
		return nil, err
	}
	if r.Spec == nil {
		return nil, fmt.Errorf("exec %s has no process spec: %w", r.ExecID, errdefs.ErrInvalidArgument)
	}
	var spec specs.Process
	if err := json.Unmarshal(r.Spec.GetValue(), &spec); err != nil {
		return nil, fmt.Errorf("decode exec %s process spec: %w: %w", r.ExecID, err, errdefs.ErrInvalidArgument)
	}
	ps, err := guestProcess("exec-"+r.ExecID, &spec, t.seccomp, r.Terminal, r.Stdin != "")
	if err != nil {
		return nil, err
	}
	sio := stdio.Stdio{Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr, Terminal: r.Terminal}
	if _, err := t.addExec(r.ExecID, ps, sio); err != nil {
		return nil, err
	}
	return empty, nil
}

// State reports a process from memory only: it never waits on the VM.
func (s *Service) State(ctx context.Context, r *taskAPI.StateRequest) (*taskAPI.StateResponse, error) {
	t, p, err := s.getProcess(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	st := t.statusOf(p)
	resp := &taskAPI.StateResponse{
		ID:       t.processID(p),
		Bundle:   t.bundle,
		Pid:      t.pidOf(p),
		Status:   st,
		Stdin:    p.stdio.Stdin,
		Stdout:   p.stdio.Stdout,
		Stderr:   p.stdio.Stderr,
		Terminal: p.stdio.Terminal,
		ExecID:   r.ExecID,
	}
	if st == tasktypes.Status_STOPPED {
		e := p.Exit()
		resp.ExitStatus = e.Status
		resp.ExitedAt = protobuf.ToTimestamp(e.At)
	}
	return resp, nil
}

// Wait blocks until the process exits.
func (s *Service) Wait(ctx context.Context, r *taskAPI.WaitRequest) (*taskAPI.WaitResponse, error) {
	_, p, err := s.getProcess(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	e, err := p.Wait(ctx)
	if err != nil {
		return nil, err
	}
	return &taskAPI.WaitResponse{ExitStatus: e.Status, ExitedAt: protobuf.ToTimestamp(e.At)}, nil
}

// Kill signals a process; with All, every process of the task.
func (s *Service) Kill(ctx context.Context, r *taskAPI.KillRequest) (*ptypes.Empty, error) {
	t, p, err := s.getProcess(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if r.Signal == 0 || r.Signal > maxSignal {
		return nil, fmt.Errorf("signal %d: want 1..%d: %w", r.Signal, maxSignal, errdefs.ErrInvalidArgument)
	}
	if err := t.kill(p, unix.Signal(r.Signal), r.All); err != nil {
		return nil, err
	}
	return empty, nil
}

// ResizePty resizes the process's terminal in the guest.
func (s *Service) ResizePty(ctx context.Context, r *taskAPI.ResizePtyRequest) (*ptypes.Empty, error) {
	t, p, err := s.getProcess(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if !p.stdio.Terminal {
		return nil, fmt.Errorf("process %s has no terminal: %w", p.spec.ID, errdefs.ErrFailedPrecondition)
	}
	if st := p.Status(); st != tasktypes.Status_RUNNING {
		return nil, fmt.Errorf("process %s is %s, want running: %w", p.spec.ID, st, errdefs.ErrFailedPrecondition)
	}
	if err := t.sb.Guest.ResizePty(ctx, p.spec.ID, r.Width, r.Height); err != nil {
		return nil, fmt.Errorf("resize pty in guest: %w", err)
	}
	return empty, nil
}

// CloseIO closes the process's stdin: the guest process reads EOF.
func (s *Service) CloseIO(ctx context.Context, r *taskAPI.CloseIORequest) (*ptypes.Empty, error) {
	_, p, err := s.getProcess(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if pio := p.getIO(); r.Stdin && pio != nil {
		pio.CloseStdin()
	}
	return empty, nil
}

// Delete removes an exited exec, or shuts the task's VM down and releases
// everything the task holds.
func (s *Service) Delete(ctx context.Context, r *taskAPI.DeleteRequest) (*taskAPI.DeleteResponse, error) {
	t, p, err := s.getProcess(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if err := s.delete(ctx, t, p); err != nil {
		return nil, err
	}
	e := p.Exit()
	return &taskAPI.DeleteResponse{Pid: t.pidOf(p), ExitStatus: e.Status, ExitedAt: protobuf.ToTimestamp(e.At)}, nil
}

func (s *Service) delete(ctx context.Context, t *task, p *process) error {
	if st := p.Status(); st == tasktypes.Status_RUNNING {
		return fmt.Errorf("process %s is running: kill it first: %w", t.processID(p), errdefs.ErrFailedPrecondition)
	}
	if p.execID != "" {
		return t.deleteExec(ctx, p)
	}
	// A stopped init's exit event may still be on its way; it goes first.
	if p.Status() == tasktypes.Status_STOPPED {
		if _, err := p.Wait(ctx); err != nil {
			return err
		}
	}
	err := t.destroy(ctx)
	e := p.Exit() // a task never started ends in destroy
	if err != nil {
		log.G(ctx).WithError(err).WithField("id", t.id).Warn("release task")
	} else if err := launch.WriteDeleted(t.bundle, launch.Deleted{Pid: uint32(t.pid()), Status: e.Status, ExitedAt: e.At}); err != nil {
		// `shim delete` then finds nothing left to clean up, the slow way.
		log.G(ctx).WithError(err).WithField("id", t.id).Warn("record the task deleted")
	}
	s.mu.Lock()
	delete(s.tasks, t.id)
	s.mu.Unlock()
	s.send(&eventstypes.TaskDelete{
		ContainerID: t.id,
		Pid:         uint32(t.pid()),
		ExitStatus:  e.Status,
		ExitedAt:    protobuf.ToTimestamp(e.At),
	})
	return nil
}
