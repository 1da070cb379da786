package cloudhypervisor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/log"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/dirtylog"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/vmmproc"
)

// vm is one Cloud Hypervisor process and its run directory.
type vm struct {
	*vmmproc.Instance
	api    *apiClient
	staged *chain.Staged
	build  string
	// source is the snapshot directory the VM was restored from, in the
	// staged directory (see materialize).
	source string
	// dirty holds the pages changed since the restore, as diff snapshots
	// report them; nil until the first diff.
	dirty *dirtylog.Log
}

var (
	_ hypervisor.VM           = (*vm)(nil)
	_ hypervisor.Checkpointer = (*vm)(nil)
)

func (v *vm) Resume(ctx context.Context) error { return v.api.put(ctx, "vm.resume", nil) }

func (v *vm) Pause(ctx context.Context) error { return v.api.put(ctx, "vm.pause", nil) }

// shutdownTimeout bounds Shutdown's wait for the VMM to exit when the
// caller's context has no deadline.
const shutdownTimeout = 10 * time.Second

// Shutdown stops the VM, then the VMM, and waits for the process to exit.
// The VMM may exit before its answer to vmm.shutdown arrives, so only the
// exit counts; a VMM that refuses, or is still running at the deadline, is
// killed.
func (v *vm) Shutdown(ctx context.Context) error {
	ctx, cancel := vmmproc.WithDefaultTimeout(ctx, shutdownTimeout)
	defer cancel()
	l := log.G(ctx).WithField("pid", v.PID())
	if err := v.api.put(ctx, "vm.shutdown", nil); err != nil {
		l.WithError(err).Warn("vm.shutdown failed, shutting the vmm down anyway")
	}
	err := v.api.put(ctx, "vmm.shutdown", nil)
	if apiErr := new(APIError); !errors.As(err, &apiErr) {
		if err != nil {
			l.WithError(err).Debug("vmm.shutdown got no answer, waiting for the exit")
		}
		err = v.Reaped(ctx)
	}
	if err != nil {
		v.Stop()
		return fmt.Errorf("shut down %s pid %d (killed): %w", Name, v.PID(), err)
	}
	return nil
}

// DialAgent connects to the guest agent's vsock port through the vsock
// device's host socket.
func (v *vm) DialAgent(ctx context.Context) (net.Conn, error) {
	return agent.DialHybridVsock(ctx, filepath.Join(v.RunDir, vsockSock), agent.VsockPort)
}

// Close kills the process if it still runs, reaps it, and removes the
// snapshot directory it was restored from and the run directory.
func (v *vm) Close() error {
	return v.CloseWith(func() error {
		var err error
		if v.dirty != nil {
			err = v.dirty.Close()
		}
		if v.source == "" {
			return err
		}
		if rerr := os.RemoveAll(v.source); rerr != nil {
			return errors.Join(err, fmt.Errorf("remove restore dir: %w", rerr))
		}
		return err
	})
}
