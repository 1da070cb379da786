package container

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
)

// Exit is how a container process ended.
type Exit struct {
	Code, Signal int
	At           time.Time
	// OOMKilled says the kernel's OOM killer killed a process of the
	// container's cgroup (only for its init).
	OOMKilled bool
}

// proc is a process of a container: its init or an exec. runc leaves it
// to the agent, a child subreaper, as its parent.
type proc struct {
	id  string
	pid int
	io  *stdio

	osp  *os.Process // a pidfd: signals never reach a reused pid
	done chan struct{}
	exit Exit // valid once done is closed
}

// watch waits for pid, now a child of the agent, and records its exit;
// onExit adds what only the caller knows (OOM) before done closes.
func watch(id string, pid int, io *stdio, onExit func(*Exit)) (*proc, error) {
	osp, err := os.FindProcess(pid)
	if err != nil {
		return nil, fmt.Errorf("find process %d of %q: %w", pid, id, err)
	}
	p := &proc{id: id, pid: pid, io: io, osp: osp, done: make(chan struct{})}
	go p.wait(onExit)
	return p, nil
}

func (p *proc) wait(onExit func(*Exit)) {
	st, err := p.osp.Wait()
	e := Exit{At: time.Now(), Code: 255}
	if err == nil {
		ws, _ := st.Sys().(syscall.WaitStatus)
		if ws.Signaled() {
			e.Signal = int(ws.Signal())
			e.Code = 128 + e.Signal
		} else {
			e.Code = ws.ExitStatus()
		}
	}
	if onExit != nil {
		onExit(&e)
	}
	p.exit = e
	close(p.done)
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal delivers sig; a process that has exited is NotFound, as runc says.
func (p *proc) signal(sig syscall.Signal) error {
	if err := p.osp.Signal(sig); err != nil {
		if errors.Is(err, os.ErrProcessDone) {
			return fmt.Errorf("process %q has exited: %w", p.id, errdefs.ErrNotFound)
		}
		return fmt.Errorf("signal %q: %w", p.id, err)
	}
	return nil
}

// procs guards a container's execs.
type procs struct {
	mu sync.Mutex
	m  map[string]*proc // nil value: being started
}
