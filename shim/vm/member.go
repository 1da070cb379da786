package vm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
)

// member is a container that joined its pod's VM. To the task service it
// is a VM (memberVM: the container's life, not the hypervisor's) and a
// guest (memberGuest: its init process and execs, through the agent's
// container calls).
type member struct {
	pod  *pod
	id   string
	slot int
	spec *specs.Spec // as the guest has it
	init *agent.ContainerProcess
	// volumeSlots hold its image volumes' disks.
	volumeSlots []int
	// created says the guest has the container (and so its disk mounted).
	created bool
	// copies are the container's copies of its bind sources in the guest.
	copies memberCopies

	goneOnce, releaseOnce sync.Once
	gone                  chan struct{} // closed once the container is killed

	mu    sync.Mutex
	execs map[string]*agent.ContainerProcess // by the task's guest id
}

var _ task.Container = (*member)(nil)

// memberCopies are what a container's copies take of its pod's: all of
// them, the container's own (the rest are directories the pod keeps), and
// the guest paths that hold them all.
type memberCopies struct {
	all, own copyUsage
	paths    []string
}

// killAll SIGKILLs every process of the container; it is then gone to the
// task, which reports an init that has not exited as killed.
func (m *member) killAll(ctx context.Context) {
	if m.init != nil {
		ctx, cancel := m.pod.bounded(ctx)
		logRelease(ctx, m.id, m.init.Signal(ctx, syscall.SIGKILL, true))
		cancel()
	}
	m.goneOnce.Do(func() { close(m.gone) })
}

// release deletes the container in the guest and frees its disk slot; once
// the guest no longer has it, the disk is detached first.
func (m *member) release(ctx context.Context) {
	m.releaseOnce.Do(func() {
		ctx, cancel := m.pod.bounded(context.WithoutCancel(ctx))
		defer cancel()
		if m.created {
			if err := m.pod.agent.DeleteContainer(ctx, m.id, ""); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				// The guest may still use the disk: the slot stays taken.
				logRelease(ctx, m.id, err)
				return
			}
			m.pod.unholdPIDs(m.init.Pid)
			// Its volumes are unmounted: its copies can go.
			logRelease(ctx, m.id, m.pod.agent.UpdateFiles(ctx, nil, []string{memberBindSources(m.id)}))
			m.pod.copies.give(m.copies.own)
		} else if m.copies.all.files > 0 {
			// Its create may have sent copies ahead: none is the pod's.
			logRelease(ctx, m.id, m.pod.agent.UpdateFiles(ctx, nil, m.copies.paths))
			m.pod.copies.give(m.copies.all)
		}
		for _, slot := range append([]int{m.slot}, m.volumeSlots...) {
			logRelease(ctx, m.id, m.pod.disks.DetachDisk(ctx, slot))
			m.pod.free(slot)
		}
	})
}

// Stats reads the container's cgroup in the guest.
func (m *member) Stats(ctx context.Context) (any, error) {
	ctx, cancel := m.pod.bounded(ctx)
	defer cancel()
	return m.pod.agent.ContainerStats(ctx, m.id)
}

// Update sets the container's resources in the guest, within the VM's.
func (m *member) Update(ctx context.Context, res *specs.LinuxResources) error {
	if err := m.pod.checkMemory(m.id, res); err != nil {
		return err
	}
	ctx, cancel := m.pod.bounded(ctx)
	defer cancel()
	return m.pod.agent.UpdateContainer(ctx, m.id, res)
}

// process is the init process for the task's init id, else an exec.
func (m *member) process(id string) (*agent.ContainerProcess, error) {
	if id == task.InitGuestID {
		return m.init, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.execs[id]
	if !ok {
		return nil, fmt.Errorf("process %s of container %s: %w", id, m.id, errdefs.ErrNotFound)
	}
	return p, nil
}

// memberVM is the container's life as the task sees a VM's: it ends when
// the container is killed; its pid is its pod's hypervisor's.
type memberVM struct{ m *member }

var _ task.VM = memberVM{}

func (v memberVM) PID() int { return v.m.pod.pid }

func (v memberVM) Pause(context.Context) error {
	return fmt.Errorf("pause container %s: a container of a pod's VM cannot be paused alone: %w", v.m.id, errdefs.ErrNotImplemented)
}

func (v memberVM) Resume(context.Context) error {
	return fmt.Errorf("resume container %s: %w", v.m.id, errdefs.ErrNotImplemented)
}

func (v memberVM) Shutdown(ctx context.Context) error {
	v.m.killAll(ctx)
	return nil
}

func (v memberVM) Kill() error {
	v.m.killAll(context.Background())
	return nil
}

func (v memberVM) Wait(ctx context.Context) error {
	select {
	case <-v.m.gone:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (v memberVM) Close() error {
	v.m.release(context.Background())
	return nil
}

// memberGuest runs the task's processes as the container's.
type memberGuest struct{ m *member }

var _ task.Guest = memberGuest{}

// Exec starts the container's process for the init, else runs p in it.
func (g memberGuest) Exec(ctx context.Context, p task.ProcessSpec) (task.Started, error) {
	ctx, cancel := g.m.pod.bounded(ctx)
	defer cancel()
	proc := g.m.init
	if p.ID == task.InitGuestID {
		pid, err := g.m.pod.agent.StartContainer(ctx, g.m.id)
		if err != nil {
			return task.Started{}, err
		}
		proc.Pid = pid
	} else {
		var err error
		if proc, err = g.m.pod.agent.ExecContainer(ctx, g.m.id, p.ID, execProcess(p, g.m.spec.Process), p.Stdin); err != nil {
			return task.Started{}, err
		}
		g.m.mu.Lock()
		g.m.execs[p.ID] = proc
		g.m.mu.Unlock()
	}
	s := task.Started{Pid: proc.Pid}
	s.Stdin, s.Stdout, s.Stderr = proc.Stdio()
	return s, nil
}

// execProcess is the OCI process of exec p, with what the task's process
// spec does not carry (capabilities, labels) from the container's.
func execProcess(p task.ProcessSpec, container *specs.Process) *specs.Process {
	out := &specs.Process{
		Terminal: p.Terminal, Args: p.Args, Env: p.Env, Cwd: p.Cwd,
		User:            specs.User{UID: p.UID, GID: p.GID, AdditionalGids: p.AdditionalGIDs, Umask: p.Umask},
		Rlimits:         p.Rlimits,
		NoNewPrivileges: p.NoNewPrivileges,
	}
	if container != nil {
		out.Capabilities = container.Capabilities
		out.ApparmorProfile, out.SelinuxLabel = container.ApparmorProfile, container.SelinuxLabel
	}
	return out
}

// Wait reports the exit with the host's time of learning it, as the VM's
// guest does.
func (g memberGuest) Wait(ctx context.Context, id string) (task.Exit, error) {
	p, err := g.m.process(id)
	if err != nil {
		return task.Exit{}, err
	}
	e, err := p.Wait(ctx)
	if err != nil {
		return task.Exit{}, err
	}
	return task.Exit{Status: uint32(e.Code), At: time.Now(), OOMKilled: e.OOMKilled}, nil
}

func (g memberGuest) Signal(ctx context.Context, id string, sig syscall.Signal) error {
	p, err := g.m.process(id)
	if err != nil {
		return err
	}
	ctx, cancel := g.m.pod.bounded(ctx)
	defer cancel()
	return p.Signal(ctx, sig, false)
}

func (g memberGuest) ResizePty(ctx context.Context, id string, width, height uint32) error {
	p, err := g.m.process(id)
	if err != nil {
		return err
	}
	ctx, cancel := g.m.pod.bounded(ctx)
	defer cancel()
	return p.ResizePty(ctx, width, height)
}

func (g memberGuest) CloseStdin(ctx context.Context, id string) error {
	p, err := g.m.process(id)
	if err != nil {
		return err
	}
	ctx, cancel := g.m.pod.bounded(ctx)
	defer cancel()
	return p.CloseStdin(ctx)
}

// Delete forgets an exited exec; the container itself goes with the VM's
// Close.
func (g memberGuest) Delete(ctx context.Context, id string) error {
	if id == task.InitGuestID {
		return nil
	}
	ctx, cancel := g.m.pod.bounded(ctx)
	defer cancel()
	g.m.mu.Lock()
	delete(g.m.execs, id)
	g.m.mu.Unlock()
	return g.m.pod.agent.DeleteContainer(ctx, g.m.id, id)
}

// Processes lists the container's init and execs that run.
func (g memberGuest) Processes(context.Context) ([]task.GuestProcess, error) {
	out := []task.GuestProcess{{Pid: g.m.init.Pid, ID: task.InitGuestID}}
	g.m.mu.Lock()
	defer g.m.mu.Unlock()
	for id, p := range g.m.execs {
		out = append(out, task.GuestProcess{Pid: p.Pid, ID: id})
	}
	return out, nil
}

// Close leaves the agent's connection open: it is the pod's.
func (g memberGuest) Close() error { return nil }
