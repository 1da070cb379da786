package container

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/containerd/errdefs"
	runc "github.com/containerd/go-runc"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// runcEngine is runc's: go-runc drives it as containerd's runc shim
// drives runc on a host.
type runcEngine struct {
	rt *runc.Runc
}

func (runcEngine) createPhase() string { return api.PhaseRuncCreate }

// create runs `runc create` with the process's stdio: pipes passed
// through, or a terminal runc sends back on a console socket.
func (e runcEngine) create(ctx context.Context, c *Container, spec *specs.Spec, withStdin bool) (int, *stdio, error) {
	setup, err := newIOSetup(spec.Process, withStdin)
	if err != nil {
		return 0, nil, fmt.Errorf("container %q: %w", c.ID, err)
	}
	pidFile := filepath.Join(c.bundle, "init.pid")
	opts := &runc.CreateOpts{PidFile: pidFile, IO: setup.io}
	if setup.sock != nil {
		opts.ConsoleSocket = setup.sock
	}
	if err := e.rt.Create(ctx, c.ID, c.bundle, opts); err != nil {
		setup.done(false)
		return 0, nil, fmt.Errorf("create container %q: %w: %w", c.ID, runcError(c.bundle, err), errdefs.ErrFailedPrecondition)
	}
	io, err := setup.done(true)
	if err == nil {
		var pid int
		if pid, err = readPid(pidFile); err == nil {
			return pid, io, nil
		}
		io.close()
	}
	_ = e.rt.Delete(context.WithoutCancel(ctx), c.ID, &runc.DeleteOpts{Force: true})
	return 0, nil, fmt.Errorf("container %q: %w", c.ID, err)
}

// start lets the init runc create left run (startInit).
func (e runcEngine) start(ctx context.Context, c *Container) error {
	return c.startInit(ctx, filepath.Join(e.rt.Root, c.ID, execFifo))
}

// exec runs p as `runc exec --detach` does; the agent is then its parent.
func (e runcEngine) exec(ctx context.Context, c *Container, execID string, p *specs.Process, withStdin bool) (int, *stdio, error) {
	setup, err := newIOSetup(p, withStdin)
	if err != nil {
		return 0, nil, err
	}
	pidFile := filepath.Join(c.bundle, execID+".pid")
	defer os.Remove(pidFile)
	opts := &runc.ExecOpts{PidFile: pidFile, Detach: true, IO: setup.io}
	if setup.sock != nil {
		opts.ConsoleSocket = setup.sock
	}
	if err := e.rt.Exec(ctx, c.ID, *p, opts); err != nil {
		setup.done(false)
		return 0, nil, fmt.Errorf("%w: %w", runcError(c.bundle, err), errdefs.ErrFailedPrecondition)
	}
	io, err := setup.done(true)
	if err != nil {
		return 0, nil, err
	}
	pid, err := readPid(pidFile)
	if err != nil {
		io.close()
		return 0, nil, err
	}
	return pid, io, nil
}

func (e runcEngine) kill(ctx context.Context, c *Container, sig syscall.Signal, all bool) error {
	if err := e.rt.Kill(ctx, c.ID, int(sig), &runc.KillOpts{All: all}); err != nil {
		return runcError(c.bundle, err)
	}
	return nil
}

func (e runcEngine) update(ctx context.Context, c *Container, r *specs.LinuxResources) error {
	if err := e.rt.Update(ctx, c.ID, r); err != nil {
		return runcError(c.bundle, err)
	}
	return nil
}

// remove is `runc delete --force`: it kills an init waiting for its
// start and whatever is left in the cgroup.
func (e runcEngine) remove(ctx context.Context, c *Container) error {
	if err := e.rt.Delete(ctx, c.ID, &runc.DeleteOpts{Force: true}); err != nil {
		return runcError(c.bundle, err)
	}
	return nil
}
