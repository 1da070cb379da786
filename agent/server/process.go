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
)

// process is one process the agent started.
type process struct {
	id       string
	cmd      *exec.Cmd
	terminal bool
	pty      *os.File // master side; stdin and stdout of a terminal process
	stdout   *outputStream
	stderr   *outputStream

	stdinMu sync.Mutex
	stdin   *os.File // nil after CloseStdin, or when there is none

	done   chan struct{}
	status exitStatus // valid once done is closed
}

type exitStatus struct {
	code, signal int
	at           time.Time
}

// startProcess starts spec with pipes, or with a new pty when terminal.
func startProcess(id string, spec *procSpec, terminal, withStdin bool) (*process, error) {
	cmd, err := spec.command()
	if err != nil {
		return nil, fmt.Errorf("start %q: %w", id, err)
	}
	p := &process{id: id, cmd: cmd, terminal: terminal, done: make(chan struct{})}
	var childEnds []*os.File
	if terminal {
		childEnds, err = p.attachPty()
	} else {
		childEnds, err = p.attachPipes(withStdin)
	}
	defer closeAll(childEnds) // the child has its own copies after Start
	if err != nil {
		return nil, err
	}
	start := cmd.Start
	if spec.needsHelper() {
		start = func() error { return startHelper(cmd) }
	}
	if err := start(); err != nil {
		p.closeParentEnds()
		return nil, fmt.Errorf("start %q: %w", id, err)
	}
	go p.reap()
	return p, nil
}

func (p *process) attachPipes(withStdin bool) ([]*os.File, error) {
	var child []*os.File
	if withStdin {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, fmt.Errorf("create stdin pipe: %w", err)
		}
		p.cmd.Stdin, p.stdin = r, w
		child = append(child, r)
	}
	for _, out := range []**outputStream{&p.stdout, &p.stderr} {
		r, w, err := os.Pipe()
		if err != nil {
			closeAll(child)
			p.closeParentEnds()
			return nil, fmt.Errorf("create output pipe: %w", err)
		}
		*out = &outputStream{f: r}
		child = append(child, w)
	}
	p.cmd.Stdout, p.cmd.Stderr = child[len(child)-2], child[len(child)-1]
	return child, nil
}

// attachPty opens a pty pair: the child gets the slave as its controlling
// terminal, the agent keeps the pollable master.
func (p *process) attachPty() ([]*os.File, error) {
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	slavePath, err := unlockPty(master)
	if err != nil {
		master.Close()
		return nil, err
	}
	slave, err := os.OpenFile(slavePath, os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		master.Close()
		return nil, fmt.Errorf("open pty slave: %w", err)
	}
	p.pty, p.stdin = master, master
	p.stdout = &outputStream{f: master, pty: true}
	p.cmd.Stdin, p.cmd.Stdout, p.cmd.Stderr = slave, slave, slave
	p.cmd.SysProcAttr.Setctty = true
	p.cmd.SysProcAttr.Ctty = 0
	return []*os.File{slave}, nil
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

// reap waits for the process and records how it ended.
func (p *process) reap() {
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
	rc, err := p.pty.SyscallConn()
	if err != nil {
		return fmt.Errorf("resize pty of %q: %w", p.id, err)
	}
	ws := &unix.Winsize{Col: uint16(width), Row: uint16(height)}
	var ioErr error
	if err := rc.Control(func(fd uintptr) { ioErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, ws) }); err != nil {
		ioErr = err
	}
	if ioErr != nil {
		return fmt.Errorf("resize pty of %q: %w", p.id, ioErr)
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
	for _, s := range []*outputStream{p.stdout, p.stderr} {
		if s != nil {
			s.f.Close()
		}
	}
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}
