package server

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/server/procio"
)

// process is one process the agent started, or prepared to start.
type process struct {
	id       string
	terminal bool
	pty      *os.File // master side; stdin and stdout of a terminal process
	stdout   *procio.Output
	stderr   *procio.Output

	stdinMu sync.Mutex
	stdin   *os.File // nil after CloseStdin, or when there is none

	done   chan struct{}
	status exitStatus // valid once done is closed

	cmd  *exec.Cmd
	fork *forked
	// started says start or discard came: the process is not held.
	mu      sync.Mutex
	started bool
}

type exitStatus struct {
	code, signal int
	at           time.Time
}

// prepareProcess gives spec its stdio (pipes, or a new pty when terminal)
// and starts forking it (see forked); start lets it run. Held, the
// process stops before its first instruction until then.
func prepareProcess(id string, spec *procSpec, terminal, withStdin, hold bool) (*process, error) {
	p := &process{id: id, terminal: terminal, done: make(chan struct{}), cmd: spec.command()}
	var stdio [3]*os.File // the child's ends
	var err error
	if terminal {
		stdio, err = p.attachPty()
	} else {
		stdio, err = p.attachPipes(withStdin)
	}
	if err != nil {
		return nil, fmt.Errorf("start %q: %w", id, err)
	}
	p.cmd.Stdin, p.cmd.Stdout, p.cmd.Stderr = stdio[0], stdio[1], stdio[2]
	if stdio[0] == nil {
		if p.cmd.Stdin, err = devNull(); err != nil {
			p.closeParentEnds()
			closeAll(stdio[:])
			return nil, fmt.Errorf("start %q: open stdin: %w", id, err)
		}
	}
	if terminal {
		p.cmd.SysProcAttr.Setctty = true
		p.cmd.SysProcAttr.Ctty = 0
	}
	p.fork = forkProcess(p.cmd, spec, hold, stdio[:])
	go p.reap()
	return p, nil
}

// start lets the process run once its fork is over, or says why it cannot.
func (p *process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.started {
		return fmt.Errorf("process %q is not waiting to start: %w", p.id, errdefs.ErrFailedPrecondition)
	}
	p.started = true
	if err := p.fork.run(); err != nil {
		p.closeParentEnds()
		return fmt.Errorf("start %q: %w", p.id, err)
	}
	return nil
}

// discard kills a held process that was never let run. It reports whether
// p was one.
func (p *process) discard() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.started {
		return false
	}
	p.started = true
	if p.fork.wait() == nil {
		_ = p.cmd.Process.Kill()
	}
	return true
}

// pid is the process's pid, 0 while (or if) it is not exec'd.
func (p *process) pid() int {
	select {
	case <-p.fork.execd:
		if p.fork.execErr == nil {
			return p.cmd.Process.Pid
		}
	default:
	}
	return 0
}

// attachPipes makes the process's pipes; without stdin the child's is
// left nil.
func (p *process) attachPipes(withStdin bool) ([3]*os.File, error) {
	var child [3]*os.File
	if withStdin {
		var w *os.File
		var err error
		if child[0], w, err = os.Pipe(); err != nil {
			return child, fmt.Errorf("create stdin pipe: %w", err)
		}
		p.stdin = w
	}
	for i, out := range []**procio.Output{&p.stdout, &p.stderr} {
		r, w, err := os.Pipe()
		if err != nil {
			closeAll(child[:])
			p.closeParentEnds()
			return child, fmt.Errorf("create output pipe: %w", err)
		}
		*out = procio.NewOutput(r, false)
		child[1+i] = w
	}
	return child, nil
}

// attachPty opens a pty pair: the child gets the slave as its controlling
// terminal, the agent keeps the pollable master.
func (p *process) attachPty() ([3]*os.File, error) {
	var child [3]*os.File
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return child, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	slavePath, err := unlockPty(master)
	if err != nil {
		master.Close()
		return child, err
	}
	slave, err := os.OpenFile(slavePath, os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		master.Close()
		return child, fmt.Errorf("open pty slave: %w", err)
	}
	p.pty, p.stdin = master, master
	p.stdout = procio.NewOutput(master, true)
	return [3]*os.File{slave, slave, slave}, nil
}

// unlockPty unlocks master's slave and names it, through the raw fd so the
// master stays in non-blocking mode (os.File.Fd would make it blocking).
func unlockPty(master *os.File) (string, error) {
	rc, err := master.SyscallConn()
	if err != nil {
		return "", fmt.Errorf("pty master: %w", err)
	}
	var n uint32
	var ioErr error
	err = rc.Control(func(fd uintptr) {
		if ioErr = unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0); ioErr != nil {
			return
		}
		n, ioErr = unix.IoctlGetUint32(int(fd), unix.TIOCGPTN)
	})
	if err = errors.Join(err, ioErr); err != nil {
		return "", fmt.Errorf("unlock pty: %w", err)
	}
	return fmt.Sprintf("/dev/pts/%d", n), nil
}

// reap waits for the process and records how it ended; one that could
// not be forked exits 127, as a shell says of a program it cannot run.
func (p *process) reap() {
	if p.fork.wait() != nil {
		p.status = exitStatus{code: 127, at: time.Now()}
		close(p.done)
		return
	}
	_ = p.cmd.Wait()
	st := exitStatus{at: time.Now()}
	if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		st.signal = int(ws.Signal())
		st.code = 128 + st.signal
	} else {
		st.code = p.cmd.ProcessState.ExitCode()
	}
	p.status = st
	close(p.done)
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal delivers sig. A process that has exited answers NotFound, as
// runc does, so the host can tell "already finished" from a failure.
func (p *process) signal(sig syscall.Signal) error {
	if p.exited() {
		return fmt.Errorf("process %q has exited: %w", p.id, errdefs.ErrNotFound)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.started {
		return fmt.Errorf("process %q has not started: %w", p.id, errdefs.ErrFailedPrecondition)
	}
	if p.fork.wait() != nil {
		return fmt.Errorf("process %q never ran: %w", p.id, errdefs.ErrNotFound)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		if errors.Is(err, os.ErrProcessDone) {
			return fmt.Errorf("process %q has exited: %w", p.id, errdefs.ErrNotFound)
		}
		return fmt.Errorf("signal %q: %w", p.id, err)
	}
	return nil
}

func (p *process) resize(width, height uint32) error {
	if p.pty == nil {
		return fmt.Errorf("process %q has no terminal: %w", p.id, errdefs.ErrFailedPrecondition)
	}
	if err := procio.Resize(p.pty, width, height); err != nil {
		return fmt.Errorf("process %q: %w", p.id, err)
	}
	return nil
}

// closeParentEnds releases the agent's ends of the process's stdio.
func (p *process) closeParentEnds() {
	p.stdinMu.Lock()
	if p.stdin != nil && p.stdin != p.pty {
		p.stdin.Close()
	}
	p.stdin = nil
	p.stdinMu.Unlock()
	for _, s := range []*procio.Output{p.stdout, p.stderr} {
		if s != nil {
			s.Close()
		}
	}
}

// devNull is the stdin of processes without one, opened once: as the
// agent starts (warmUp), so that a restored clone opens no file for it.
var devNull = sync.OnceValues(func() (*os.File, error) { return os.Open(os.DevNull) })

func closeAll(files []*os.File) {
	for _, f := range files {
		if f != nil {
			f.Close()
		}
	}
}
