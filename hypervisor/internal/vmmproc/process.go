// Package vmmproc supervises every driver's VMM process (QEMU, Cloud
// Hypervisor, Firecracker): spawn it in its own process group or session
// and in the network namespace it is given (or a new one of its own), with
// inherited fds, wait for a REST VMM's API socket, kill and reap it (its
// whole group) by PID, keep its exit status for every waiter, describe how
// it ended with the tail of its log, and remove its run directory when it
// is closed.
package vmmproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// MaxSockPath is the longest unix socket path (sun_path less the NUL).
const MaxSockPath = 107

// socketPoll is how often Start looks for the API socket: these VMMs bind
// it themselves and take no listening fd, so there is nothing to be told.
const socketPoll = 2 * time.Millisecond

// spawnTimeout bounds Start's wait for the API socket when the caller's
// context has no deadline: a VMM that never serves its API must not hang it.
const spawnTimeout = 10 * time.Second

// Spec says how to start a VMM.
type Spec struct {
	// Binary and Args are the command line.
	Binary string
	Args   []string
	// Log is the file, in the working directory, the output goes to.
	Log string
	// Socket is the API socket the VMM binds once it serves requests.
	Socket string
	// NetNS, if set, is the network namespace (an nsfs file) the VMM is
	// born in: what it opens by name, such as a tap, is the namespace's.
	NetNS *os.File
	// OwnNetNS starts the VMM in a new, empty network namespace that only
	// it holds, so whatever network device it creates there is gone with
	// it. It excludes NetNS.
	OwnNetNS bool
	// ExtraFiles are inherited as fds 3, 4, ...
	ExtraFiles []*os.File
	// Attached ties the VMM to its parent: it gets SIGKILL when the parent
	// dies (a bake's throwaway VM, a spare's pooled VM). Otherwise it runs
	// in a session of its own and outlives a crashed shim, as a task's VM
	// must.
	Attached bool
	// BornIn, if set, forks the VMM in the VM's cgroup: it runs start,
	// which forks with attr on the calling OS thread (see
	// hypervisor.Cgroup.Start).
	BornIn func(attr *syscall.SysProcAttr, start func() error) error
}

// Process is one supervised VMM process. Its exit status is collected
// once, by the goroutine started with it, and kept for every Wait.
type Process struct {
	cmd  *exec.Cmd
	name string
	log  string // path of its output
	done chan struct{}
	err  error
}

// Start spawns s in dir and returns once its API socket accepts
// connections. On failure the process is killed and reaped.
func Start(ctx context.Context, dir string, s Spec) (*Process, error) {
	if err := CheckSockPath(s.Socket); err != nil {
		return nil, err
	}
	p, err := Spawn(dir, s)
	if err != nil {
		return nil, err
	}
	if err := p.waitSocket(ctx, s.Socket); err != nil {
		p.Stop()
		return nil, err
	}
	return p, nil
}

// Spawn starts the process in dir, its output appended to s.Log there; the
// caller waits for it to serve however it serves.
func Spawn(dir string, s Spec) (*Process, error) {
	if s.NetNS != nil && s.OwnNetNS {
		return nil, errors.New("start hypervisor: both a network namespace and one of its own asked for")
	}
	logf, err := os.OpenFile(filepath.Join(dir, s.Log), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open hypervisor log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(s.Binary, s.Args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = s.ExtraFiles
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if s.Attached {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	}
	if s.OwnNetNS {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWNET
	}
	start := cmd.Start
	if s.BornIn != nil {
		start = func() error { return s.BornIn(cmd.SysProcAttr, cmd.Start) }
	}
	p := &Process{cmd: cmd, name: filepath.Base(s.Binary), log: logf.Name(), done: make(chan struct{})}
	fork := startIn
	if s.Attached {
		fork = func(f *os.File, start func() error) error { return startAttached(f, start, p.done) }
	}
	if err := fork(s.NetNS, start); err != nil {
		return nil, fmt.Errorf("start %s: %w", s.Binary, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// startIn runs start, which forks the VMM, in the network namespace f, or
// in ours when f is nil: the fork happens on an OS thread switched into f,
// so the child is born there.
func startIn(f *os.File, start func() error) error {
	if f == nil {
		return start()
	}
	target, err := ns.GetNS(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
	if err != nil {
		return fmt.Errorf("network namespace %s: %w", f.Name(), err)
	}
	defer target.Close()
	if err := target.Do(func(ns.NetNS) error { return start() }); err != nil {
		return fmt.Errorf("in network namespace %s: %w", f.Name(), err)
	}
	return nil
}

// startAttached runs start, which forks an attached VMM (its parent-death
// signal set), on an OS thread of its own, switched into the network
// namespace f when f is set, that lives until the VMM has exited (done):
// the signal follows the thread that forked, not the process, and Go ends
// a thread whose goroutine returns while locked to it, as code locking a
// thread to change its state does (a spare's start, a namespace not
// restored). On a shared thread any of those would kill the VMM.
func startAttached(f *os.File, start func() error, done <-chan struct{}) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		if f != nil {
			if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
				errc <- fmt.Errorf("enter network namespace %s: %w", f.Name(), err)
				return
			}
		}
		err := start()
		errc <- err
		if err == nil {
			<-done
		}
	}()
	return <-errc
}

// waitSocket returns once something accepts connections on path, failing
// early if the process exits or ctx ends.
func (p *Process) waitSocket(ctx context.Context, path string) error {
	ctx, cancel := WithDefaultTimeout(ctx, spawnTimeout)
	defer cancel()
	t := time.NewTicker(socketPoll)
	defer t.Stop()
	for {
		c, err := net.Dial("unix", path)
		if err == nil {
			return c.Close()
		}
		select {
		case <-p.done:
			return fmt.Errorf("hypervisor exited before serving its API: %v", p.err)
		case <-ctx.Done():
			return fmt.Errorf("wait for api socket %s: %w", path, ctx.Err())
		case <-t.C:
		}
	}
}

// PID is the process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Done is closed once the process has been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Kill sends SIGKILL to the process's group (the VMM and anything it
// forked) unless the process has been reaped: then its pid, and so the
// group's id, may be another's.
func (p *Process) Kill() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := syscall.Kill(-p.PID(), syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill %s pid %d: %w", p.name, p.PID(), err)
	}
	return nil
}

// ExitedWithin reports whether the process exits within d: a VMM that
// drops its control connection is usually on its way out, and its exit
// status and log say why better than "connection reset".
func (p *Process) ExitedWithin(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-t.C:
		return false
	}
}

// ExitError waits for the process to be reaped and says how it ended,
// with the tail of its log.
func (p *Process) ExitError() error {
	<-p.done
	err := p.err
	if err == nil {
		err = errors.New("exit status 0")
	}
	if tail := logTail(p.log); tail != "" {
		return fmt.Errorf("%s exited: %w: %s", p.name, err, tail)
	}
	return fmt.Errorf("%s exited: %w", p.name, err)
}

// logTailBytes is how much of a VMM's log an exit error quotes.
const logTailBytes = 512

func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	b = bytes.TrimSpace(b)
	if len(b) > logTailBytes {
		b = b[len(b)-logTailBytes:]
	}
	return string(b)
}

// Wait blocks until the process has exited or ctx ends. It returns nil
// for a clean exit and the exit error (a non-zero status or a signal)
// otherwise, to every caller: a crashed VMM must not look like a clean exit.
func (p *Process) Wait(ctx context.Context) error {
	if err := p.Reaped(ctx); err != nil {
		return err
	}
	if p.err != nil {
		return fmt.Errorf("%s pid %d: %w", p.name, p.PID(), p.err)
	}
	return nil
}

// Reaped blocks until the process has been reaped, whatever its exit
// status, or ctx ends: for a shutdown, where the exit is what counts. An
// exit already reaped wins over an ended ctx, so an ended ctx asks
// whether the process has exited without waiting.
func (p *Process) Reaped(ctx context.Context) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for %s pid %d: %w", p.name, p.PID(), ctx.Err())
	}
}

// Stop kills the process and waits until it has been reaped.
func (p *Process) Stop() error {
	err := p.Kill()
	<-p.done
	return err
}

// CheckSockPath fails for a path too long to bind a unix socket on.
func CheckSockPath(path string) error {
	if len(path) > MaxSockPath {
		return fmt.Errorf("socket path %s is %d bytes: unix sockets allow %d", path, len(path), MaxSockPath)
	}
	return nil
}

// WithDefaultTimeout bounds ctx by d unless it already has a deadline.
func WithDefaultTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}
