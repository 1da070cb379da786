package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
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

// process is one supervised QEMU process. Its exit status is collected
// once, by the goroutine started with it, and kept for every Wait.
type process struct {
	cmd    *exec.Cmd
	runDir string
	done   chan struct{}
	err    error
}

// spawn is how to start QEMU.
type spawn struct {
	binary string
	args   []string
	runDir string
	// extra are inherited after the QMP listener: fd 4, 5, ...
	extra []*os.File
	// netns, if set, is the network namespace QEMU starts in.
	netns *os.File
	// detach keeps QEMU alive when its parent dies: restored VMs must
	// outlive a crashed shim; a bake's throwaway VM must not outlive bake.
	detach bool
}

// start starts QEMU serving QMP on runDir/qmp.sock and returns once QMP has
// answered. On error the process is killed and reaped.
func start(ctx context.Context, s spawn) (*process, *qmp, error) {
	l, err := listenQMP(filepath.Join(s.runDir, qmpSock))
	if err != nil {
		return nil, nil, err
	}
	p, err := s.exec(l)
	if err != nil {
		return nil, nil, err
	}
	q, err := p.connect(ctx)
	if err != nil {
		p.kill()
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

func (s spawn) exec(qmpListener *os.File) (*process, error) {
	defer qmpListener.Close()
	logf, err := os.OpenFile(filepath.Join(s.runDir, qemuLog), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open qemu log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(s.binary, s.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = append([]*os.File{qmpListener}, s.extra...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if s.detach {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	} else {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	}
	if err := startIn(s.netns, cmd); err != nil {
		return nil, fmt.Errorf("start %s: %w", s.binary, err)
	}
	p := &process{cmd: cmd, runDir: s.runDir, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// connect dials QMP and negotiates it; it fails early if QEMU exits.
func (p *process) connect(ctx context.Context) (*qmp, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-p.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", filepath.Join(p.runDir, qmpSock))
	if err == nil {
		var q *qmp
		if q, err = newQMP(ctx, conn); err == nil {
			return q, nil
		}
	}
	if p.exitedWithin(exitGrace) {
		return nil, fmt.Errorf("connect qmp: %w", p.exitError())
	}
	return nil, fmt.Errorf("connect qmp: %w", err)
}

// exitedWithin reports whether the process exits within d. A QMP socket
// that refuses or drops us means QEMU is on its way out; its exit status
// and log say why, which beats "connection reset".
func (p *process) exitedWithin(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-t.C:
		return false
	}
}

// exitError describes how QEMU ended, with the tail of its log.
func (p *process) exitError() error {
	<-p.done
	err := p.err
	if err == nil {
		err = errors.New("exit status 0")
	}
	if tail := p.logTail(); tail != "" {
		return fmt.Errorf("qemu exited: %w: %s", err, tail)
	}
	return fmt.Errorf("qemu exited: %w", err)
}

func (p *process) logTail() string {
	b, err := os.ReadFile(filepath.Join(p.runDir, qemuLog))
	if err != nil {
		return ""
	}
	b = bytes.TrimSpace(b)
	if len(b) > 512 {
		b = b[len(b)-512:]
	}
	return string(b)
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// kill sends SIGKILL to QEMU's process group (QEMU and anything it
// forked) and waits until QEMU is reaped. The group outlives a QEMU that
// died first, and its id cannot be reused while it has members, so those
// are killed then too.
func (p *process) kill() error {
	if err := syscall.Kill(-p.pid(), syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill qemu %d: %w", p.pid(), err)
	}
	<-p.done
	return nil
}

// wait blocks until the process exits or ctx ends. It returns nil for a
// clean exit and the exit error otherwise.
func (p *process) wait(ctx context.Context) error {
	select {
	case <-p.done:
		if p.err != nil {
			return fmt.Errorf("qemu %d: %w", p.pid(), p.err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for qemu %d: %w", p.pid(), context.Cause(ctx))
	}
}
