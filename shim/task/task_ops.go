package task

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/containerd/api/types/runc/options"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

const (
	// shutdownTimeout bounds a graceful VM shutdown before it is killed.
	shutdownTimeout = 10 * time.Second
	// exitTimeout bounds the wait for a killed hypervisor to be reaped.
	exitTimeout = 10 * time.Second
)

var errFinished = fmt.Errorf("process already finished: %w", errdefs.ErrNotFound)

// kill delivers sig to p; with all, to every exec first, then to p.
func (t *task) kill(p *process, sig unix.Signal, all bool) error {
	if all && p.execID == "" {
		for _, e := range t.execList() {
			if err := t.signal(e, sig); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				return err
			}
		}
	}
	return t.signal(p, sig)
}

func (t *task) execList() []*process {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*process, 0, len(t.execs))
	for _, p := range t.execs {
		out = append(out, p)
	}
	return out
}

// signal delivers sig to p. A process that never started ends with
// 128+sig. One the guest says has exited, while its output still drains,
// is finished (NotFound, as runc's shim answers). SIGKILL to the init
// process kills the VM when the guest cannot answer: the VM is paused or
// the agent does not reply in time.
func (t *task) signal(p *process, sig unix.Signal) error {
	p.lifecycle.Lock()
	defer p.lifecycle.Unlock()
	switch p.Status() {
	case tasktypes.Status_STOPPED:
		return errFinished
	case tasktypes.Status_CREATED:
		if p.endBeforeStart(sig) {
			return nil
		}
		return errFinished
	}
	select {
	case <-t.vmDone:
		return nil // the VM is gone; the watcher reports the exit
	default:
	}
	initKill := sig == unix.SIGKILL && p.execID == ""
	if initKill && t.isPaused() {
		t.killVM("SIGKILL while the VM is paused")
		return nil
	}
	err := t.sb.Guest.Signal(t.ctx, p.spec.ID, sig)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errdefs.ErrNotFound), errors.Is(err, errdefs.ErrFailedPrecondition):
		// An agent that predates NotFound says FailedPrecondition.
		return errFinished
	case initKill:
		log.G(t.ctx).WithError(err).WithField("id", t.id).Warn("guest did not take SIGKILL")
		t.killVM("guest did not answer SIGKILL")
		return nil
	default:
		return fmt.Errorf("signal %d to %s in guest: %w", sig, p.spec.ID, err)
	}
}

// poststart runs the poststart hooks; as runc does, a failing one kills
// the init process it followed and fails the start.
func (t *task) poststart(ctx context.Context) error {
	if t.hooks == nil {
		return nil
	}
	err := t.hooks.started(ctx, t.pid())
	if err == nil {
		return nil
	}
	if kerr := t.kill(t.init, unix.SIGKILL, true); kerr != nil && !errors.Is(kerr, errdefs.ErrNotFound) {
		err = errors.Join(err, fmt.Errorf("kill init after the failed hook: %w", kerr))
	}
	return err
}

// pause pauses the VM.
func (t *task) pause(ctx context.Context) error {
	t.opMu.Lock()
	defer t.opMu.Unlock()
	if t.isPaused() {
		return fmt.Errorf("task %s is already paused: %w", t.id, errdefs.ErrFailedPrecondition)
	}
	if st := t.init.Status(); st != tasktypes.Status_RUNNING {
		return fmt.Errorf("task %s is %s, want running: %w", t.id, st, errdefs.ErrFailedPrecondition)
	}
	if err := t.sb.VM.Pause(ctx); err != nil {
		return fmt.Errorf("pause VM: %w", err)
	}
	t.setPaused(true)
	return nil
}

// resume resumes the paused VM.
func (t *task) resume(ctx context.Context) error {
	t.opMu.Lock()
	defer t.opMu.Unlock()
	if !t.isPaused() {
		return fmt.Errorf("task %s is not paused: %w", t.id, errdefs.ErrFailedPrecondition)
	}
	if err := t.sb.VM.Resume(ctx); err != nil {
		return fmt.Errorf("resume VM: %w", err)
	}
	t.setPaused(false)
	return nil
}

func (t *task) setPaused(v bool) {
	t.mu.Lock()
	t.paused = v
	t.mu.Unlock()
}

// checkpoint writes a chain link of the VM into dir: a diff on the chain
// the VM was restored from, holding the pages changed since, or a full
// link where the driver cannot make one (it logs why). A running VM whose
// driver snapshots live is stopped only while its state is captured;
// otherwise the VM is paused for the snapshot and resumed after, unless
// exit asks to end the task.
func (t *task) checkpoint(ctx context.Context, dir string, exit bool) error {
	t.opMu.Lock()
	defer t.opMu.Unlock()
	snap, ok := t.sb.VM.(hypervisor.Checkpointer)
	if !ok {
		return fmt.Errorf("checkpoint: the %s driver cannot snapshot a running VM: %w", t.sb.Hypervisor, errdefs.ErrNotImplemented)
	}
	if st := t.init.Status(); st != tasktypes.Status_RUNNING {
		return fmt.Errorf("task %s is %s, want running: %w", t.id, st, errdefs.ErrFailedPrecondition)
	}
	wasPaused := t.isPaused()
	if live, ok := snap.(hypervisor.LiveCheckpointer); ok && !wasPaused && !exit {
		if err := t.snapshot(ctx, live.SnapshotLive, dir); err != nil {
			return fmt.Errorf("snapshot VM into %s: %w", dir, err)
		}
		return nil
	}
	if !wasPaused {
		if err := t.sb.VM.Pause(ctx); err != nil {
			return fmt.Errorf("pause VM for checkpoint: %w", err)
		}
		t.setPaused(true)
	}
	if err := t.snapshot(ctx, snap.Snapshot, dir); err != nil {
		return errors.Join(fmt.Errorf("snapshot VM into %s: %w", dir, err), t.resumeAfter(ctx, wasPaused))
	}
	if exit {
		t.killVM("checkpointed with exit")
		return nil
	}
	return t.resumeAfter(ctx, wasPaused)
}

// snapshot writes a diff link, else a full one where no diff is possible.
func (t *task) snapshot(ctx context.Context, take func(context.Context, string, hypervisor.SnapshotKind) error, dir string) error {
	err := take(ctx, dir, hypervisor.SnapshotDiff)
	if !errors.Is(err, hypervisor.ErrNoDiffBase) {
		return err
	}
	log.G(ctx).WithError(err).WithField("id", t.id).Warn("checkpoint writes a full link: no diff is possible")
	return take(ctx, dir, hypervisor.SnapshotFull)
}

func (t *task) resumeAfter(ctx context.Context, wasPaused bool) error {
	if wasPaused {
		return nil
	}
	if err := t.sb.VM.Resume(ctx); err != nil {
		return fmt.Errorf("resume VM after checkpoint: %w", err)
	}
	t.setPaused(false)
	return nil
}

// pids lists the guest's processes, naming the execs the shim started.
func (t *task) pids(ctx context.Context) ([]*tasktypes.ProcessInfo, error) {
	procs, err := t.sb.Guest.Processes(ctx)
	if err != nil {
		return nil, fmt.Errorf("list guest processes: %w", err)
	}
	execByGuestID := map[string]string{}
	for _, p := range t.execList() {
		execByGuestID[p.spec.ID] = p.execID
	}
	out := make([]*tasktypes.ProcessInfo, 0, len(procs))
	for _, gp := range procs {
		info := &tasktypes.ProcessInfo{Pid: gp.Pid}
		if execID, ok := execByGuestID[gp.ID]; ok && gp.ID != "" {
			if info.Info, err = typeurl.MarshalAnyToProto(&options.ProcessDetails{ExecID: execID}); err != nil {
				return nil, fmt.Errorf("encode process %d details: %w", gp.Pid, err)
			}
		}
		out = append(out, info)
	}
	return out, nil
}

// stats reports the hypervisor cgroup's metrics, or for a container in its
// pod's VM its cgroup's in the guest.
func (t *task) stats(ctx context.Context) (any, error) {
	if c := t.sb.Container; c != nil {
		return c.Stats(ctx)
	}
	if t.cg == nil {
		return nil, fmt.Errorf("task %s has no cgroup (its spec sets no cgroupsPath): %w", t.id, errdefs.ErrNotFound)
	}
	m, err := t.cg.Stats()
	if err != nil {
		return nil, fmt.Errorf("read cgroup stats: %w", err)
	}
	return m, nil
}

// update applies new resources to the hypervisor cgroup: CPU limits as
// given, a memory limit (which CRI repeats on every update) as the VM's
// budget makes it.
func (t *task) update(ctx context.Context, res *specs.LinuxResources) error {
	if c := t.sb.Container; c != nil {
		return c.Update(ctx, res)
	}
	vres, err := t.sb.Memory.vmResources(res)
	if err != nil {
		return err
	}
	if t.cg == nil {
		return fmt.Errorf("task %s has no cgroup (its spec sets no cgroupsPath): %w", t.id, errdefs.ErrNotFound)
	}
	if err := t.cg.Update(vres); err != nil {
		return fmt.Errorf("update cgroup: %w", err)
	}
	return nil
}

// destroy shuts the VM down and releases everything the task holds. An
// init that never started ends first, so its exit precedes the delete.
func (t *task) destroy(ctx context.Context) error {
	t.reports.Wait()
	t.init.lifecycle.Lock()
	ended := t.init.endBeforeStart(unix.SIGKILL)
	t.init.lifecycle.Unlock()
	if ended {
		<-t.init.done
	}
	sctx, cancel := context.WithTimeout(ctx, shutdownTimeout)
	defer cancel()
	if err := t.sb.VM.Shutdown(sctx); err != nil {
		log.G(ctx).WithError(err).WithField("id", t.id).Warn("VM did not shut down; killing it")
		t.killVM("shutdown failed")
	}
	var running error
	select {
	case <-t.vmDone:
	case <-time.After(exitTimeout):
		running = errors.New("hypervisor still runs after kill")
		log.G(ctx).WithField("id", t.id).Error(running)
	}
	t.releaseNetwork()
	if t.hooks != nil {
		t.hooks.stopped(ctx, t.pid())
	}
	return errors.Join(running, closeVM(t.sb, t.cg))
}

// deleteExec forgets an exec that never started or has exited.
func (t *task) deleteExec(ctx context.Context, p *process) error {
	p.lifecycle.Lock()
	p.endBeforeStart(unix.SIGKILL)
	p.lifecycle.Unlock()
	if _, err := p.Wait(ctx); err != nil {
		return err
	}
	t.mu.Lock()
	delete(t.execs, p.execID)
	t.mu.Unlock()
	if p.startedInGuest() {
		if err := t.sb.Guest.Delete(ctx, p.spec.ID); err != nil {
			log.G(ctx).WithError(err).WithField("exec", p.execID).Warn("forget exec in guest")
		}
	}
	return nil
}
