package pause

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
)

// proc is the pause process as the task service's VM: a sandbox has no
// hypervisor, so its process stands where one would.
type proc struct {
	cmd    *exec.Cmd
	runDir string // removed once the process is gone
	done   chan struct{}

	mu     sync.Mutex
	status syscall.WaitStatus
	at     time.Time
}

var _ task.VM = (*proc)(nil)

func newProc(cmd *exec.Cmd, runDir string) *proc {
	p := &proc{cmd: cmd, runDir: runDir, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait() // the status is read from ProcessState below
		p.mu.Lock()
		p.status, _ = cmd.ProcessState.Sys().(syscall.WaitStatus)
		p.at = time.Now()
		p.mu.Unlock()
		close(p.done)
	}()
	return p
}

func (p *proc) PID() int { return p.cmd.Process.Pid }

func (p *proc) Pause(context.Context) error {
	return fmt.Errorf("pause a pod sandbox: it runs no VM: %w", errdefs.ErrNotImplemented)
}

func (p *proc) Resume(context.Context) error {
	return fmt.Errorf("resume a pod sandbox: it runs no VM: %w", errdefs.ErrNotImplemented)
}

// Shutdown asks the pause process to exit and waits for it.
func (p *proc) Shutdown(ctx context.Context) error {
	if err := p.signal(unix.SIGTERM); err != nil {
		return err
	}
	return p.Wait(ctx)
}

func (p *proc) Kill() error { return p.signal(unix.SIGKILL) }

// signal delivers sig unless the process has exited (and so may have been
// reaped and its pid reused).
func (p *proc) signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal pause process %d: %w", p.PID(), err)
	}
	return nil
}

func (p *proc) Wait(ctx context.Context) error {
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close kills the process if it still runs, waits for it to be reaped and
// removes its run dir.
func (p *proc) Close() error {
	if err := p.Kill(); err != nil {
		return err
	}
	<-p.done
	if err := os.RemoveAll(p.runDir); err != nil {
		return fmt.Errorf("remove pause run dir: %w", err)
	}
	return nil
}

// exit is how the process ended, as containerd reports exits.
func (p *proc) exit() task.Exit {
	p.mu.Lock()
	defer p.mu.Unlock()
	code := uint32(p.status.ExitStatus())
	if p.status.Signaled() {
		code = 128 + uint32(p.status.Signal())
	}
	return task.Exit{Status: code, At: p.at}
}

// guest is the pause process as the task service's guest: its init
// process is the pause process itself, which runs from Create on.
type guest struct{ p *proc }

var _ task.Guest = guest{}

// Exec "starts" the init process, which runs already and has no stdio.
func (g guest) Exec(_ context.Context, ps task.ProcessSpec) (task.Started, error) {
	if ps.ID != task.InitGuestID {
		return task.Started{}, fmt.Errorf("exec %v: %w: %w", ps.Args, errNoExec, errdefs.ErrNotImplemented)
	}
	return task.Started{Pid: uint32(g.p.PID())}, nil
}

func (g guest) Wait(ctx context.Context, _ string) (task.Exit, error) {
	if err := g.p.Wait(ctx); err != nil {
		return task.Exit{}, err
	}
	return g.p.exit(), nil
}

func (g guest) Signal(_ context.Context, _ string, sig syscall.Signal) error {
	select {
	case <-g.p.done:
		return fmt.Errorf("pause process has exited: %w", errdefs.ErrNotFound)
	default:
	}
	return g.p.signal(sig)
}

func (g guest) ResizePty(context.Context, string, uint32, uint32) error { return nil }
func (g guest) CloseStdin(context.Context, string) error                { return nil }
func (g guest) Delete(context.Context, string) error                    { return nil }
func (g guest) Close() error                                            { return nil }

func (g guest) Processes(context.Context) ([]task.GuestProcess, error) {
	return []task.GuestProcess{{Pid: uint32(g.p.PID()), ID: task.InitGuestID}}, nil
}
