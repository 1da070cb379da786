package task

import (
	"context"
	"sync"
	"time"

	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/pkg/stdio"
	"golang.org/x/sys/unix"
)

// process is one process of a task: the init process or an exec. Its
// status and exit live in memory so State never waits on the VM.
type process struct {
	execID string // "" for the init process
	spec   ProcessSpec
	stdio  stdio.Stdio

	// lifecycle serialises start and kill of this process.
	lifecycle sync.Mutex

	mu       sync.Mutex
	ran      bool   // the guest ran it
	guestPid uint32 // its pid in the guest once it ran; 0 if unknown
	status   tasktypes.Status
	exit     Exit
	io       *processIO
	aborted  *Exit // set when the process is ended before it ever started

	started chan struct{} // closed once the guest runs it and the start event is queued
	abort   chan struct{} // closed to end a process that never started
	done    chan struct{} // closed once its exit is known and published
}

func newProcess(execID string, spec ProcessSpec, sio stdio.Stdio) *process {
	return &process{
		execID:  execID,
		spec:    spec,
		stdio:   sio,
		status:  tasktypes.Status_CREATED,
		started: make(chan struct{}),
		abort:   make(chan struct{}),
		done:    make(chan struct{}),
	}
}

// Status is the process's own status: created, running or stopped.
func (p *process) Status() tasktypes.Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.status
}

// Exit returns the exit, valid once Status is STOPPED.
func (p *process) Exit() Exit {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exit
}

// setRunning records that the guest runs the process as guestPid with io
// attached; the caller closes started once the start event is queued.
func (p *process) setRunning(guestPid uint32, pio *processIO) {
	p.mu.Lock()
	p.ran, p.guestPid = true, guestPid
	p.status = tasktypes.Status_RUNNING
	p.io = pio
	p.mu.Unlock()
}

// guestPID is the process's pid in the guest (0 if the agent did not say)
// and whether the guest ever ran it.
func (p *process) guestPID() (pid uint32, ran bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.guestPid, p.ran
}

// startable reports whether the process is created and was not ended.
func (p *process) startable() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.status == tasktypes.Status_CREATED && p.aborted == nil
}

// endBeforeStart ends a process that never started with 128+sig. It
// reports false if the process has started or already ended.
func (p *process) endBeforeStart(sig unix.Signal) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.status != tasktypes.Status_CREATED || p.aborted != nil {
		return false
	}
	p.aborted = &Exit{Status: 128 + uint32(sig), At: time.Now()}
	close(p.abort)
	return true
}

func (p *process) abortExit() Exit {
	p.mu.Lock()
	defer p.mu.Unlock()
	return *p.aborted
}

// setExited records the exit; done closes only after the exit event is
// queued, by finish.
func (p *process) setExited(e Exit) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.status = tasktypes.Status_STOPPED
	p.exit = e
}

func (p *process) finish() { close(p.done) }

// Wait blocks until the process has exited or ctx ends.
func (p *process) Wait(ctx context.Context) (Exit, error) {
	select {
	case <-p.done:
		return p.Exit(), nil
	case <-ctx.Done():
		return Exit{}, ctx.Err()
	}
}

// startedInGuest reports whether the guest ever ran the process.
func (p *process) startedInGuest() bool {
	select {
	case <-p.started:
		return true
	default:
		return false
	}
}

func (p *process) getIO() *processIO {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.io
}
