package task

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
)

// TestKillWhileOutputDrains signals a process that has exited in the guest
// while its output still drains: the shim must answer NotFound ("already
// finished", what CRI's StopContainer accepts) and keep the VM.
func TestKillWhileOutputDrains(t *testing.T) {
	tests := []struct {
		name   string
		execID string
		sig    syscall.Signal
		// agentErr, if set, is what the guest answers instead of
		// NotFound, as an older agent did.
		agentErr error
	}{
		{"init SIGTERM", "", syscall.SIGTERM, nil},
		{"init SIGKILL", "", syscall.SIGKILL, nil},
		{"exec SIGTERM", "e1", syscall.SIGTERM, nil},
		{"exec SIGKILL", "e1", syscall.SIGKILL, nil},
		{"init SIGKILL, older agent", "", syscall.SIGKILL, fmt.Errorf("process has exited: %w", errdefs.ErrFailedPrecondition)},
		{"exec SIGTERM, older agent", "e1", syscall.SIGTERM, fmt.Errorf("process has exited: %w", errdefs.ErrFailedPrecondition)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			guestID := InitGuestID
			if tt.execID == "" {
				h.create("t1", specFor("detach"), newFifos(t, false, false))
			} else {
				h.create("t1", specFor("sleep"), newFifos(t, false, false))
				h.start("t1", "")
				req := execSpec(t, "detach")
				req.ExecID = tt.execID
				if _, err := h.svc.Exec(h.ctx, req); err != nil {
					t.Fatal(err)
				}
				guestID = "exec-" + tt.execID
			}
			h.start("t1", tt.execID)
			p, err := h.guest.proc(guestID)
			if err != nil {
				t.Fatal(err)
			}
			<-p.exited
			h.guest.mu.Lock()
			h.guest.signalErr = tt.agentErr
			h.guest.mu.Unlock()
			_, err = h.svc.Kill(h.ctx, &taskAPI.KillRequest{ID: "t1", ExecID: tt.execID, Signal: uint32(tt.sig)})
			if !errors.Is(err, errdefs.ErrNotFound) {
				t.Fatalf("Kill of a process whose output drains: %v, want not found", err)
			}
			if h.vm.exited() {
				t.Fatal("Kill of an exited process killed the VM")
			}
			p.outW.Close()
			if got := h.wait("t1", tt.execID); got != 0 {
				t.Fatalf("exit %d, want 0", got)
			}
		})
	}
}

// TestVMDiesDuringStart kills the VM while Start is in the guest: the
// process ends with the VM, and the stdio its Start attached is closed.
func TestVMDiesDuringStart(t *testing.T) {
	h := newHarness(t)
	sio := newFifos(t, false, false)
	h.create("t1", specFor("sleep"), sio)
	h.guest.execGate, h.guest.execEntered = make(chan struct{}), make(chan struct{})
	started := make(chan error, 1)
	go func() {
		_, err := h.svc.Start(h.ctx, &taskAPI.StartRequest{ID: "t1"})
		started <- err
	}()
	<-h.guest.execEntered
	tk, err := h.svc.getTask("t1")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.vm.Kill(); err != nil {
		t.Fatal(err)
	}
	<-tk.vmDone
	close(h.guest.execGate)
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	if got := h.wait("t1", ""); got != 137 {
		t.Fatalf("exit after the VM died %d, want 137", got)
	}
	sio.output(t) // fails unless the shim closed its end of stdout
}

// TestDestroyAllKillsEveryVMFirst shuts down with one task's init exit held
// back by a start stuck in the guest: every VM is killed and closed, and
// the wait ends with the shutdown's context, not after exitTimeout.
func TestDestroyAllKillsEveryVMFirst(t *testing.T) {
	h := newHarness(t)
	running := h.vm
	h.create("running", specFor("sleep"), newFifos(t, false, false))
	h.start("running", "")

	stuck := newFakeVM(t)
	h.vm, h.launcher.vm, h.launcher.guest = stuck, stuck, newFakeGuest()
	h.create("stuck", specFor("sleep"), newFifos(t, false, false))
	gate := make(chan struct{})
	release := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(release)
	h.launcher.guest.execGate, h.launcher.guest.execEntered = gate, make(chan struct{}, 1)
	started := make(chan struct{})
	go func() {
		_, _ = h.svc.Start(h.ctx, &taskAPI.StartRequest{ID: "stuck"})
		close(started)
	}()
	<-h.launcher.guest.execEntered

	ctx, cancel := context.WithCancel(h.ctx)
	cancel()
	returned := make(chan struct{})
	go func() { _ = h.svc.destroyAll(ctx); close(returned) }()
	select {
	case <-returned:
	case <-time.After(exitTimeout / 2):
		t.Fatal("destroyAll waited for a stuck task past its context")
	}
	for name, vm := range map[string]*fakeVM{"running": running, "stuck": stuck} {
		<-vm.done
		vm.mu.Lock()
		closed := vm.closed
		vm.mu.Unlock()
		if !closed {
			t.Errorf("VM of task %s not closed", name)
		}
	}
	// The start opens its stdio FIFOs: let it finish while they have readers.
	release()
	<-started
}
