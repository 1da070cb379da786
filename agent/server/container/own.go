package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/containerd/cgroups/v3/cgroup2"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/cinit"
)

// ownInit is the engine of the agent's own container init (agent/cinit):
// the agent makes the container's cgroup and starts cocoon-cinit in it
// and in the container's new namespaces; the init builds the container,
// says so and waits for its start. No runc process runs on the way:
// under TCG a warm `runc create` costs a guest ~280 ms.
type ownInit struct {
	exe     func() (*os.File, error) // the container init's sealed binary
	cg      *cgroup2.Manager
	seccomp *cinit.Seccomp // the container's, for its execs too
	oomAdj  *int           // the container's OOM score, as runc gives its execs
	caps    *cinit.Caps    // the container's, for an exec that names none
	startW  *os.File       // the init's start pipe, until its start
	statusR *os.File       // the init's status pipe, until its start
}

func (*ownInit) createPhase() string { return api.PhaseInitCreate }

func (e *ownInit) create(ctx context.Context, c *Container, spec *specs.Spec, withStdin bool) (int, *stdio, error) {
	plan, err := planInit(spec)
	if err != nil {
		return 0, nil, err
	}
	e.seccomp, e.oomAdj, e.caps = plan.cfg.Process.Seccomp, plan.cfg.Process.OOMScoreAdj, plan.cfg.Process.Caps
	if e.cg, err = makeCgroup(c.cgroup, spec.Linux.Resources); err != nil {
		return 0, nil, err
	}
	io, child, err := newChildStdio(spec.Process, withStdin)
	if err != nil {
		return 0, nil, errors.Join(err, e.cg.Delete())
	}
	plan.cfg.Init.Console = child.console
	h, err := e.launch(launch{cfg: &plan.cfg, cgroup: c.cgroup, stdio: child, cloneflags: plan.cloneflags, joinPID: plan.joinPID, withStart: true})
	child.close()
	if err == nil {
		if err = h.ready(ctx); err != nil {
			h.kill()
			err = fmt.Errorf("%w: %w", err, errdefs.ErrFailedPrecondition)
		}
	}
	if err != nil {
		io.close()
		return 0, nil, errors.Join(err, e.cg.Delete())
	}
	e.startW, e.statusR = h.start, h.status
	return h.cmd.Process.Pid, io, nil
}

// start gives the init its start byte and waits for its exec.
func (e *ownInit) start(ctx context.Context, c *Container) error {
	if e.startW == nil {
		return errInitEnded
	}
	_, err := e.startW.Write([]byte{1})
	e.startW.Close()
	e.startW = nil
	defer e.statusR.Close()
	if err != nil {
		if c.init.exited() {
			return errInitEnded
		}
		return fmt.Errorf("start the container's init: %w", err)
	}
	return readExec(ctx, e.statusR)
}

func (e *ownInit) kill(_ context.Context, c *Container, sig syscall.Signal, all bool) error {
	if !all {
		return c.init.signal(sig)
	}
	if sig == unix.SIGKILL {
		if err := e.cg.Kill(); err != nil {
			return fmt.Errorf("kill cgroup %s: %w", c.cgroup, err)
		}
		return nil
	}
	pids, err := e.cg.Procs(true)
	if err != nil {
		return fmt.Errorf("list cgroup %s: %w", c.cgroup, err)
	}
	for _, pid := range pids {
		if err := unix.Kill(int(pid), sig); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("signal %d: %w", pid, err)
		}
	}
	return nil
}

func (e *ownInit) update(_ context.Context, _ *Container, r *specs.LinuxResources) error {
	return e.cg.Update(cgroupResources(r))
}

// makeCgroup makes the container's cgroup with r, every controller of the
// hierarchy enabled above it, as runc does: the stats read memory, pids
// and io files that a cgroup without limits of their kind would lack.
func makeCgroup(path string, r *specs.LinuxResources) (*cgroup2.Manager, error) {
	cg, err := cgroup2.NewManager(cgroupRoot, path, cgroupResources(r))
	if err != nil {
		return nil, fmt.Errorf("make cgroup %s: %w", path, err)
	}
	all, err := cg.RootControllers()
	if err == nil {
		err = cg.ToggleControllers(all, cgroup2.Enable)
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("enable the controllers of cgroup %s: %w", path, err), cg.Delete())
	}
	return cg, nil
}

// cgroupResources are r as cgroup v2 takes them; none for nil (which
// cgroup2.ToResources does not take).
func cgroupResources(r *specs.LinuxResources) *cgroup2.Resources {
	if r == nil {
		return &cgroup2.Resources{}
	}
	return cgroup2.ToResources(r)
}

// cgroupEmptyWait bounds the wait for a killed cgroup's processes to go.
const cgroupEmptyWait = 5 * time.Second

// remove ends an init never started (its start pipe closes unwritten),
// kills what is left in the cgroup and removes it once empty.
func (e *ownInit) remove(ctx context.Context, c *Container) error {
	if e.startW != nil {
		e.startW.Close()
		e.statusR.Close()
		e.startW = nil
	}
	if err := e.cg.Kill(); err != nil {
		return fmt.Errorf("kill cgroup %s: %w", c.cgroup, err)
	}
	deadline := time.Now().Add(cgroupEmptyWait)
	for {
		pids, err := e.cg.Procs(true)
		if err == nil && len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("cgroup %s still holds %v after its kill: %w", c.cgroup, pids, errors.Join(err, ctx.Err()))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := e.cg.Delete(); err != nil {
		return fmt.Errorf("remove cgroup %s: %w", c.cgroup, err)
	}
	return nil
}
