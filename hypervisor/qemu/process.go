package qemu

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/vmmproc"
)

// Files in a VM's run directory.
const (
	qmpSock   = "qmp.sock"
	agentSock = "agent.sock"
	serialLog = "serial.log"
	qemuLog   = "qemu.log"
)

// exitGrace is how long a QEMU that dropped QMP gets to exit.
const exitGrace = 500 * time.Millisecond

// qmpChildFD is the QMP listener's fd number in QEMU (first ExtraFiles entry).
const qmpChildFD = 3

// spawn is how to start QEMU.
type spawn struct {
	binary string
	args   []string
	runDir string
	// extra are inherited after the QMP listener: fd 4, 5, ...
	extra []*os.File
	// netns, if set, is the network namespace QEMU starts in.
	netns *os.File
	// bornIn, if set, forks QEMU in the VM's cgroup.
	bornIn func(*syscall.SysProcAttr, func() error) error
	// detach keeps QEMU alive when its parent dies: restored VMs must
	// outlive a crashed shim; a bake's throwaway VM must not outlive bake.
	detach bool
}

// start starts QEMU serving QMP on runDir/qmp.sock and returns once QMP has
// answered. On error the process is killed and reaped.
func start(ctx context.Context, s spawn) (*vmmproc.Process, *qmp, error) {
	l, err := listenQMP(filepath.Join(s.runDir, qmpSock))
	if err != nil {
		return nil, nil, err
	}
	p, err := vmmproc.Spawn(s.runDir, vmmproc.Spec{
		Binary: s.binary, Args: s.args, Log: qemuLog,
		ExtraFiles: append([]*os.File{l}, s.extra...), NetNS: s.netns, Attached: !s.detach, BornIn: s.bornIn,
	})
	l.Close()
	if err != nil {
		return nil, nil, err
	}
	q, err := connect(ctx, p, s.runDir)
	if err != nil {
		p.Stop()
		return nil, nil, err
	}
	return p, q, nil
}

// listenQMP binds the QMP socket ourselves and hands QEMU the listening fd,
// so a connect succeeds at once and QEMU's greeting is the readiness signal:
// no polling for the socket to appear.
func listenQMP(path string) (*os.File, error) {
	if err := vmmproc.CheckSockPath(path); err != nil {
		return nil, err
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen qmp socket: %w", err)
	}
	l.SetUnlinkOnClose(false)
	defer l.Close()
	f, err := l.File()
	if err != nil {
		return nil, fmt.Errorf("qmp listener fd: %w", err)
	}
	return f, nil
}

// connect dials QMP and negotiates it; it fails early if QEMU exits.
func connect(ctx context.Context, p *vmmproc.Process, runDir string) (*qmp, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-p.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", filepath.Join(runDir, qmpSock))
	if err == nil {
		var q *qmp
		if q, err = newQMP(ctx, conn); err == nil {
			return q, nil
		}
	}
	if p.ExitedWithin(exitGrace) {
		return nil, fmt.Errorf("connect qmp: %w", p.ExitError())
	}
	return nil, fmt.Errorf("connect qmp: %w", err)
}
