package vm

import (
	"context"
	"syscall"
	"time"

	"github.com/containerd/log"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
)

// guest adapts the agent client to task.Guest. Calls that answer at once
// are bounded by the configured call timeout; Wait and the stdio streams
// last as long as the process does.
type guest struct {
	c           *agent.Client
	callTimeout time.Duration
}

var _ task.Guest = (*guest)(nil)

// NewGuest wraps an agent client for the task service.
func NewGuest(c *agent.Client, callTimeout time.Duration) task.Guest {
	return &guest{c: c, callTimeout: callTimeout}
}

func (g *guest) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if g.callTimeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, g.callTimeout)
}

// Exec starts the process the restore prepared, or p itself if there is
// none (an exec, or a guest whose agent cannot prepare one).
func (g *guest) Exec(ctx context.Context, p task.ProcessSpec) (task.Started, error) {
	ctx, cancel := g.bounded(ctx)
	defer cancel()
	var proc *agent.Process
	var err error
	if g.c.Prepared(p.ID) {
		proc, err = g.c.Start(ctx, p.ID)
	} else {
		proc, err = g.c.Exec(ctx, p)
	}
	if err != nil {
		return task.Started{}, err
	}
	s := task.Started{Pid: proc.Pid}
	s.Stdin, s.Stdout, s.Stderr = proc.Stdio()
	return s, nil
}

// Wait reports the exit with the host's time of learning it: the guest's
// clock is only as right as its last Init made it, and containerd compares
// exit times with its own.
func (g *guest) Wait(ctx context.Context, id string) (task.Exit, error) {
	st, err := g.c.Wait(ctx, id)
	if err != nil {
		return task.Exit{}, err
	}
	return task.Exit{Status: uint32(st.Code), At: time.Now()}, nil
}

func (g *guest) Signal(ctx context.Context, id string, sig syscall.Signal) error {
	ctx, cancel := g.bounded(ctx)
	defer cancel()
	return g.c.Signal(ctx, id, sig)
}

func (g *guest) ResizePty(ctx context.Context, id string, width, height uint32) error {
	ctx, cancel := g.bounded(ctx)
	defer cancel()
	return g.c.ResizePty(ctx, id, width, height)
}

func (g *guest) CloseStdin(ctx context.Context, id string) error {
	ctx, cancel := g.bounded(ctx)
	defer cancel()
	return g.c.CloseStdin(ctx, id)
}

func (g *guest) Delete(ctx context.Context, id string) error {
	ctx, cancel := g.bounded(ctx)
	defer cancel()
	return g.c.Delete(ctx, id)
}

// Processes lists the guest's processes; a list the agent cut short to
// bound its reply is logged, as containerd's process list has no place to
// say so.
func (g *guest) Processes(ctx context.Context) ([]task.GuestProcess, error) {
	ctx, cancel := g.bounded(ctx)
	defer cancel()
	procs, err := g.c.Processes(ctx)
	if err != nil {
		return nil, err
	}
	if procs.Omitted > 0 {
		log.G(ctx).WithField("omitted", procs.Omitted).Warn("the guest agent left processes out of its list")
	}
	out := make([]task.GuestProcess, 0, len(procs.Processes))
	for _, p := range procs.Processes {
		out = append(out, task.GuestProcess{Pid: p.Pid, ID: p.ID})
	}
	return out, nil
}

func (g *guest) Close() error { return g.c.Close() }
