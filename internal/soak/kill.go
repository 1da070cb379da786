package soak

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"syscall"
	"time"

	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// pollInterval is how often a kill during create looks for its target.
const pollInterval = 20 * time.Millisecond

// killDuringCreate kills the plan's target while the task is created: the
// shim and QEMU once they appear and the plan's delay has passed (QEMU's a
// third of it, as its restore is shorter than the shim's create), the task
// as soon as containerd knows it, which is when its create returns.
func (r *run) killDuringCreate(ctx context.Context, created <-chan struct{}) {
	delay := r.plan.Kill.Delay
	if r.plan.Kill.Kind == KillQEMU {
		delay /= 3
	}
	done := false
	for !r.killed {
		select {
		case <-created:
			done = true
		case <-ctx.Done():
			return
		case <-time.After(pollInterval):
		}
		if r.plan.Kill.Kind == KillTask {
			r.killed = r.killTaskByID(ctx) == nil
		} else if pid, ok := r.target(); ok {
			sleep(ctx, delay)
			r.killed = killPID(pid) == nil
		}
		if done {
			return
		}
	}
}

// killAndWait kills the plan's target now and waits for the task's exit.
func (r *run) killAndWait(ctx context.Context) error {
	var err error
	switch pid, ok := r.target(); {
	case r.plan.Kill.Kind == KillTask:
		err = r.task.Kill(ctx, syscall.SIGKILL)
	case !ok:
		err = fmt.Errorf("no %s process to kill", r.plan.Kill.Kind)
	default:
		err = killPID(pid)
	}
	if err != nil {
		return fmt.Errorf("kill %s: %w", r.plan.Kill.Kind, err)
	}
	r.killed = true
	return r.waitExit(ctx)
}

// waitExit waits for the task's exit after a kill; a task that never
// reports one is stuck, a failure even for a killed restore.
func (r *run) waitExit(ctx context.Context) error {
	if r.exited == nil {
		return nil
	}
	st, err := waitStatus(ctx, r.exited)
	if err != nil && ctx.Err() == nil && r.plan.Kill != nil {
		r.stuck = fmt.Errorf("task never exited after its %s was killed: %w", r.plan.Kill.Kind, err)
	}
	if err == nil {
		err = st.Error()
	}
	return err
}

// target finds the pid of the plan's shim or QEMU.
func (r *run) target() (int, bool) {
	var (
		p  proc
		ok bool
	)
	switch r.plan.Kill.Kind {
	case KillShim:
		p, ok = findShim(r.s.stack.Dir, r.plan.ID)
	case KillQEMU:
		p, ok = findQEMU(r.s.stack.Dir, filepath.Join(r.s.stack.RunDir, r.s.stack.Namespace, r.plan.ID))
	}
	return p.pid, ok
}

// killTaskByID is SIGKILL of the task through containerd before the client
// has the task: containerd knows it once its create returns.
func (r *run) killTaskByID(ctx context.Context) error {
	_, err := r.s.client.TaskService().Kill(ctx, &tasksapi.KillRequest{ContainerID: r.plan.ID, Signal: uint32(syscall.SIGKILL)})
	return err
}

// killPID sends SIGKILL through a pidfd, so a pid reused meanwhile is never
// hit by a stale number.
func killPID(pid int) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return fmt.Errorf("open pid %d: %w", pid, err)
	}
	defer unix.Close(fd)
	if isZombie(pid) {
		return fmt.Errorf("pid %d: %w", pid, unix.ESRCH)
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil {
		return fmt.Errorf("kill pid %d: %w", pid, err)
	}
	return nil
}

// isGone reports an error saying the object is already gone.
func isGone(err error) bool {
	return errdefs.IsNotFound(errors.Unwrap(err)) || errdefs.IsNotFound(err)
}
