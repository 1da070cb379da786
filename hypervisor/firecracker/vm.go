package firecracker

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"time"

	"github.com/containerd/log"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/firecracker/uffd"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/dirtylog"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/vmmproc"
)

// shutdownGrace is how long Shutdown waits for the guest to act on
// Ctrl+Alt+Del before killing Firecracker.
const shutdownGrace = 5 * time.Second

// vm is one Firecracker process and its run directory.
type vm struct {
	*vmmproc.Instance
	api    *apiClient
	staged *chain.Staged
	build  string
	// faults serves guest page faults for ondemand restores.
	faults *uffd.Handler
	// dirty holds the pages changed since the restore, as Diff snapshots
	// report them; dirtyLost says a Full snapshot restarted Firecracker's
	// dirty log, so that it no longer tells.
	dirty     *dirtylog.Log
	dirtyLost bool
}

var (
	_ hypervisor.VM           = (*vm)(nil)
	_ hypervisor.Checkpointer = (*vm)(nil)
)

// vmState is the PATCH /vm body (Vm in the spec).
type vmState struct {
	State string `json:"state"`
}

// action is the PUT /actions body (InstanceActionInfo in the spec).
type action struct {
	ActionType string `json:"action_type"`
}

func (v *vm) Resume(ctx context.Context) error {
	return v.api.call(ctx, "PATCH", "vm", vmState{State: "Resumed"})
}

func (v *vm) Pause(ctx context.Context) error {
	return v.api.call(ctx, "PATCH", "vm", vmState{State: "Paused"})
}

// Shutdown sends Ctrl+Alt+Del, which a Linux guest answers by rebooting
// and Firecracker by exiting; a guest that does not react within
// shutdownGrace (or ctx) is stopped by killing Firecracker.
func (v *vm) Shutdown(ctx context.Context) error {
	l := log.G(ctx).WithField("pid", v.PID())
	if err := v.api.call(ctx, "PUT", "actions", action{ActionType: "SendCtrlAltDel"}); err != nil {
		l.WithError(err).Warn("SendCtrlAltDel failed, killing firecracker")
		return v.Stop()
	}
	graceCtx, cancel := context.WithTimeout(ctx, shutdownGrace)
	defer cancel()
	if err := v.Reaped(graceCtx); err != nil {
		l.WithError(err).Warn("guest ignored Ctrl+Alt+Del, killing firecracker")
		return v.Stop()
	}
	return nil
}

// DialAgent connects to the guest agent's vsock port through the vsock
// device's host socket (vsock_override put it in the run directory).
func (v *vm) DialAgent(ctx context.Context) (net.Conn, error) {
	return agent.DialHybridVsock(ctx, filepath.Join(v.RunDir, vsockSock), agent.VsockPort)
}

// Close kills the process if it still runs, reaps it, stops the page-fault
// handler and removes the run directory.
func (v *vm) Close() error {
	return v.CloseWith(func() error {
		var err error
		if v.dirty != nil {
			err = v.dirty.Close()
		}
		if v.faults != nil {
			err = errors.Join(err, v.faults.Close())
		}
		return err
	})
}
