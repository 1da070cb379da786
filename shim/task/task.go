package task

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/pkg/protobuf"
	"github.com/containerd/containerd/v2/pkg/stdio"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
)

const (
	// execDrainTimeout bounds how long an init exit waits for the execs it
	// killed to report their exits before the VM itself is killed.
	execDrainTimeout = 10 * time.Second
)

// task is one container: a VM, its init process and its execs.
type task struct {
	id     string
	bundle string
	sb     *Sandbox
	cg     VMCgroup // nil when the spec names no cgroup
	send   func(evt any)
	// created is when Create began, the restore report's origin.
	created   time.Time
	namespace string
	hooks     *ociHooks
	// host is the pod VM this container joined; nil for a VM of its own.
	host Host
	// sysctls are a pod sandbox's linux.sysctl, the pod's, which its
	// containers' VMs set (guestSysctls).
	sysctls map[string]string
	// seccomp is the spec's linux.seccomp, which the task's execs start
	// under too, as runc's do; nil for none.
	seccomp *specs.LinuxSeccomp

	ctx    context.Context // ends when the hypervisor process exits
	cancel context.CancelFunc
	vmDone chan struct{}

	recMu sync.Mutex
	rec   *state.Task
	// phases are the restore report's, guarded by recMu.
	phases []state.Phase
	// reports are report writes off the RPC path; destroy waits for them,
	// so none lands in a bundle containerd is removing.
	reports sync.WaitGroup

	init *process

	// opMu serialises pause, resume and checkpoint; never held by State.
	opMu sync.Mutex

	mu         sync.Mutex
	execs      map[string]*process
	paused     bool
	initExited bool           // no exec may start once set
	execsLive  sync.WaitGroup // execs whose exit is not yet published
}

func newTask(ctx context.Context, id, bundle string, sb *Sandbox, rec *state.Task, init *process, send func(any)) *task {
	t := &task{
		id: id, bundle: bundle, sb: sb, rec: rec, init: init, send: send,
		vmDone: make(chan struct{}),
		execs:  map[string]*process{},
	}
	t.ctx, t.cancel = context.WithCancel(context.WithoutCancel(ctx))
	return t
}

// run starts watching the VM and the init process; call it after the
// create event is queued, so no exit can precede it.
func (t *task) run() {
	go func() {
		if err := t.sb.VM.Wait(t.ctx); err != nil && t.ctx.Err() == nil {
			log.G(t.ctx).WithError(err).WithField("id", t.id).Warn("wait for hypervisor")
		}
		close(t.vmDone)
		t.cancel()
	}()
	go t.watch(t.init)
}

// pid is the task's pid: the hypervisor's.
func (t *task) pid() int { return t.sb.VM.PID() }

// pidOf is the pid containerd knows p by. The init process is the task,
// so it has the task's pid, which containerd uses for the task; an exec
// has its pid in the guest once started and 0 before, as with runc (or
// the task's pid if the guest's agent does not report pids).
func (t *task) pidOf(p *process) uint32 {
	if p.execID == "" {
		return uint32(t.pid())
	}
	pid, ran := p.guestPID()
	switch {
	case pid != 0:
		return pid
	case !ran:
		return 0
	}
	return uint32(t.pid())
}

// statusOf is p's status as containerd sees it: a running process of a
// paused VM is paused.
func (t *task) statusOf(p *process) tasktypes.Status {
	st := p.Status()
	if st == tasktypes.Status_RUNNING && t.isPaused() {
		return tasktypes.Status_PAUSED
	}
	return st
}

func (t *task) isPaused() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.paused
}

// process returns the init process for "" or the exec execID.
func (t *task) process(execID string) (*process, error) {
	if execID == "" {
		return t.init, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.execs[execID]
	if !ok {
		return nil, fmt.Errorf("exec %s of task %s: %w", execID, t.id, errdefs.ErrNotFound)
	}
	return p, nil
}

// addExec registers a new exec process; it starts with start.
func (t *task) addExec(execID string, spec ProcessSpec, sio stdio.Stdio) (*process, error) {
	t.mu.Lock()
	if _, ok := t.execs[execID]; ok {
		t.mu.Unlock()
		return nil, fmt.Errorf("exec %s: %w", execID, errdefs.ErrAlreadyExists)
	}
	if t.initExited {
		t.mu.Unlock()
		return nil, fmt.Errorf("task %s init process is not running: %w", t.id, errdefs.ErrFailedPrecondition)
	}
	p := newProcess(execID, spec, sio)
	t.execs[execID] = p
	t.execsLive.Add(1)
	t.mu.Unlock()
	// The watcher starts after the event is queued, so no exit precedes it.
	t.send(&eventstypes.TaskExecAdded{ContainerID: t.id, ExecID: execID})
	go t.watch(p)
	return p, nil
}

// start runs p in the guest and attaches its stdio.
func (t *task) start(ctx context.Context, p *process) error {
	p.lifecycle.Lock()
	defer p.lifecycle.Unlock()
	if !p.startable() {
		return fmt.Errorf("process %s is %s, want created: %w", p.spec.ID, p.Status(), errdefs.ErrFailedPrecondition)
	}
	if p.execID != "" && t.initIsGone() {
		return fmt.Errorf("task %s init process is not running: %w", t.id, errdefs.ErrFailedPrecondition)
	}
	started, err := t.sb.Guest.Exec(ctx, p.spec)
	if err != nil {
		return fmt.Errorf("exec %v in guest: %w", p.spec.Args, err)
	}
	pio, err := attachIO(ctx, p.stdio, started.Streams, ioOwner{id: t.id, namespace: t.namespace})
	if err != nil {
		t.abandon(p, started.Pid)
		return err
	}
	p.setRunning(started.Pid, pio)
	if p.execID == "" {
		t.send(&eventstypes.TaskStart{ContainerID: t.id, Pid: t.pidOf(p)})
	} else {
		t.send(&eventstypes.TaskExecStarted{ContainerID: t.id, ExecID: p.execID, Pid: t.pidOf(p)})
	}
	close(p.started)
	return nil
}

// abandon kills a guest process whose stdio could not be attached; its
// watcher still reports the exit.
func (t *task) abandon(p *process, guestPid uint32) {
	if err := t.sb.Guest.Signal(t.ctx, p.spec.ID, unix.SIGKILL); err != nil {
		log.G(t.ctx).WithError(err).WithField("process", p.spec.ID).Warn("kill process without stdio")
	}
	p.setRunning(guestPid, nil)
	close(p.started)
}

func (t *task) initIsGone() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.initExited
}

// watch reports p's exit once: after the guest says it ended, after it was
// ended before starting, or when the VM died. An init exit is published
// only after every exec's.
func (t *task) watch(p *process) {
	var exit Exit
	select {
	case <-p.started:
		exit = t.waitGuest(p)
	case <-p.abort:
		exit = p.abortExit()
	case <-t.vmDone:
		// Let a start in flight finish, so its start event goes first,
		// then release the stdio it attached: no waitGuest will.
		p.lifecycle.Lock()
		p.lifecycle.Unlock()
		if pio := p.getIO(); pio != nil {
			pio.Close()
		}
		exit = Exit{Status: 128 + uint32(unix.SIGKILL), At: time.Now()}
	}
	if p.execID == "" {
		t.endExecs()
		t.recordExit(exit)
		t.releaseNetwork()
	}
	p.setExited(exit)
	if exit.OOMKilled {
		// CRI reports an exit as OOMKilled when this event precedes it,
		// as runc's shim sends it.
		t.send(&eventstypes.TaskOOM{ContainerID: t.id})
	}
	t.send(&eventstypes.TaskExit{
		ContainerID: t.id,
		ID:          t.processID(p),
		Pid:         t.pidOf(p),
		ExitStatus:  exit.Status,
		ExitedAt:    protobuf.ToTimestamp(exit.At),
	})
	p.finish()
	if p.execID != "" {
		t.execsLive.Done()
	}
}

// processID is the id containerd knows p by: the task id for init.
func (t *task) processID(p *process) string {
	if p.execID == "" {
		return t.id
	}
	return p.execID
}

// waitGuest waits for p to end in the guest and for its output to drain.
func (t *task) waitGuest(p *process) Exit {
	pio := p.getIO()
	if pio != nil {
		defer pio.Close()
	}
	exit, err := t.sb.Guest.Wait(t.ctx, p.spec.ID)
	if err != nil {
		exit = Exit{Status: 128 + uint32(unix.SIGKILL), At: time.Now()}
		if t.ctx.Err() == nil {
			log.G(t.ctx).WithError(err).WithField("process", p.spec.ID).Error("guest lost the process")
			if p.execID == "" {
				t.killVM("guest agent lost the init process")
			}
		}
		return exit
	}
	if pio != nil {
		pio.waitOutput(t.ctx)
	}
	return exit
}

// endExecs stops every exec once init has exited and waits until their
// exits are published; execs that do not end in time end with the VM.
func (t *task) endExecs() {
	t.mu.Lock()
	t.initExited = true
	execs := make([]*process, 0, len(t.execs))
	for _, p := range t.execs {
		execs = append(execs, p)
	}
	t.mu.Unlock()
	for _, p := range execs {
		if err := t.signal(p, unix.SIGKILL); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			log.G(t.ctx).WithError(err).WithField("exec", p.execID).Warn("kill exec after init exit")
		}
	}
	drained := make(chan struct{})
	go func() { t.execsLive.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(execDrainTimeout):
		t.killVM("execs did not exit after their init")
		<-drained
	}
}

// releaseNetwork gives the VM's network back once its init has exited: a
// pod's next container (an init container's successor) takes the pod's
// interface, and nothing the guest still sends can reach it.
func (t *task) releaseNetwork() {
	if t.sb.Network == nil {
		return
	}
	if err := t.sb.Network.Release(); err != nil {
		log.G(t.ctx).WithError(err).WithField("id", t.id).Warn("release VM network")
	}
}

// killVM SIGKILLs the hypervisor; every watcher then sees the VM gone.
func (t *task) killVM(why string) {
	log.G(t.ctx).WithFields(log.Fields{"id": t.id, "pid": t.pid(), "reason": why}).Warn("killing VM")
	if err := t.sb.VM.Kill(); err != nil {
		log.G(t.ctx).WithError(err).WithField("id", t.id).Error("kill VM")
	}
}

// recordExit persists the init exit so `shim delete` can report it after a
// shim crash.
func (t *task) recordExit(e Exit) {
	t.recMu.Lock()
	defer t.recMu.Unlock()
	t.rec.Exit = &state.Exit{Status: e.Status, At: e.At}
	if err := state.WriteTask(t.bundle, t.rec); err != nil {
		log.G(t.ctx).WithError(err).WithField("id", t.id).Error("persist init exit")
	}
}
