package qemu

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/containerd/log"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/vmmproc"
)

// Default bounds for waits whose context has no deadline.
const (
	startTimeout    = 15 * time.Second
	migrateTimeout  = 2 * time.Minute
	commandTimeout  = 10 * time.Second
	shutdownTimeout = 10 * time.Second
)

var (
	_ hypervisor.VM               = (*VM)(nil)
	_ hypervisor.Checkpointer     = (*VM)(nil)
	_ hypervisor.LiveCheckpointer = (*VM)(nil)
)

// VM is one QEMU process and its run directory.
type VM struct {
	proc   *vmmproc.Process
	qmp    *qmp
	runDir string
	shape  Shape
	// staged is the chain the VM was restored from; nil for a booted VM.
	staged *chain.Staged
	// memPath is where the guest RAM can be read while the VM is paused:
	// the shared backing file, or our memfd under copy. Empty under mmap,
	// where changed pages are private to QEMU.
	memPath string
	memfd   *os.File
	// hashes are a copy restore's page hashes of the memory it restored,
	// what a diff snapshot compares the memfd with.
	hashes *pendingHash
	// written are the hashes of the pages the restore wrote from staged
	// deltas over the staged memory file.
	written *pageHashes
	// disks are the backends of the spare disk slots.
	disks diskSlots
	once  sync.Once
	err   error
}

// PID is the QEMU process id.
func (v *VM) PID() int { return v.proc.PID() }

// RunDir is the VM's private directory (sockets, logs).
func (v *VM) RunDir() string { return v.runDir }

// AgentSocket is the host end of the guest agent's virtio-serial port.
func (v *VM) AgentSocket() string { return filepath.Join(v.runDir, agentSock) }

// SerialLog is the guest console log.
func (v *VM) SerialLog() string { return filepath.Join(v.runDir, serialLog) }

func (v *VM) command(ctx context.Context, name string, args any) error {
	ctx, cancel := vmmproc.WithDefaultTimeout(ctx, commandTimeout)
	defer cancel()
	return v.qmp.Execute(ctx, name, args, nil)
}

// Resume runs the vCPUs.
func (v *VM) Resume(ctx context.Context) error { return v.command(ctx, "cont", nil) }

// Pause stops the vCPUs.
func (v *VM) Pause(ctx context.Context) error { return v.command(ctx, "stop", nil) }

// Shutdown asks QEMU to quit and waits for it to exit; past the deadline
// it is killed. The guest agent's Shutdown is the place to sync the guest
// first.
func (v *VM) Shutdown(ctx context.Context) error {
	ctx, cancel := vmmproc.WithDefaultTimeout(ctx, shutdownTimeout)
	defer cancel()
	// quit may lose its reply to the exit it causes; the exit is what counts.
	qerr := v.qmp.Execute(ctx, "quit", nil, nil)
	select {
	case <-v.proc.Done():
		return nil
	case <-ctx.Done():
	}
	log.G(ctx).WithError(qerr).WithField("pid", v.PID()).Warn("qemu did not exit after quit, killing it")
	return v.proc.Stop()
}

// Kill sends SIGKILL to QEMU and waits until it is reaped.
func (v *VM) Kill() error { return v.proc.Stop() }

// Wait blocks until QEMU has exited; a non-zero exit or a signal is an error.
func (v *VM) Wait(ctx context.Context) error { return v.proc.Wait(ctx) }

// DialAgent opens an agent session on the guest agent's port.
func (v *VM) DialAgent(ctx context.Context) (net.Conn, error) {
	return agent.DialUnix(ctx, v.AgentSocket())
}

// Close kills QEMU if it still runs and removes the run directory.
func (v *VM) Close() error {
	v.once.Do(func() {
		v.qmp.Close()
		kerr := v.proc.Stop()
		if v.memfd != nil {
			v.memfd.Close()
		}
		if v.hashes != nil {
			v.hashes.stop()
		}
		v.err = errors.Join(kerr, os.RemoveAll(v.runDir))
	})
	return v.err
}
