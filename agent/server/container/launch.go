package container

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/cinit"
)

// launch is one start of the container init (cocoon-cinit).
type launch struct {
	cfg        *cinit.Config
	cgroup     string // relative to the hierarchy's root
	stdio      *childStdio
	cloneflags uintptr
	joinPID    string   // a PID namespace to join instead of a new one
	joinInit   int      // an exec: the init whose namespaces it joins
	mountNS    *os.File // an exec: the container's mount namespace
	withStart  bool     // a container's init: it waits for its start
}

// helper is a started container init and the agent's ends of its pipes.
type helper struct {
	cmd    *exec.Cmd
	status *os.File
	start  *os.File // nil for an exec
}

// launch starts the container init in l's namespaces and cgroup (from
// birth: CLONE_INTO_CGROUP) and gives it its config.
func (e *ownInit) launch(l launch) (*helper, error) {
	var p pipes
	defer p.closeChildEnds()
	h, err := p.forHelper(l.withStart)
	if err != nil {
		p.closeOwnEnds()
		return nil, err
	}
	cg, err := os.Open(filepath.Join(cgroupRoot, l.cgroup))
	if err != nil {
		p.closeOwnEnds()
		return nil, fmt.Errorf("open cgroup: %w", err)
	}
	defer cg.Close()
	exe, err := e.exe()
	if err != nil {
		p.closeOwnEnds()
		return nil, err
	}
	cmd := e.command(execPath(exe), l, p.child, cg)
	if err := startIn(cmd, l); err != nil {
		p.closeOwnEnds()
		return nil, fmt.Errorf("start the container init: %w", err)
	}
	h.cmd = cmd
	p.closeChildEnds()
	cfgW := p.own[0]
	err = json.NewEncoder(cfgW).Encode(l.cfg)
	cfgW.Close()
	if err != nil {
		h.kill()
		return nil, fmt.Errorf("send the container init its config: %w", err)
	}
	return h, nil
}

// forHelper makes the helper's config and status pipes and, withStart,
// its start pipe.
func (p *pipes) forHelper(withStart bool) (*helper, error) {
	if _, err := p.add(false); err != nil {
		return nil, err
	}
	status, err := p.add(true)
	if err != nil {
		return nil, err
	}
	h := &helper{status: status}
	if withStart {
		if h.start, err = p.add(false); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// command is the helper's command: its stdio, pipes (config, status,
// then the start pipe or the mount namespace), namespaces and cgroup.
func (e *ownInit) command(path string, l launch, child []*os.File, cg *os.File) *exec.Cmd {
	fourth := l.mountNS
	if l.withStart {
		fourth = child[2]
	}
	cmd := exec.Command(path)
	cmd.Args[0] = "cocoon-cinit"
	cmd.Env = []string{}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = l.stdio.files[0], l.stdio.files[1], l.stdio.files[2]
	cmd.ExtraFiles = []*os.File{child[0], child[1], fourth}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: l.cloneflags, Setsid: true,
		Setctty: l.stdio.terminal, UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	return cmd
}

// startIn starts cmd, from a thread that joined l's namespaces first when
// it has some to join: a child takes its PID namespace from the thread
// that forks it.
func startIn(cmd *exec.Cmd, l launch) error {
	if l.joinPID == "" && l.joinInit == 0 {
		return cmd.Start()
	}
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread dies with the namespaces it joined.
		runtime.LockOSThread()
		if err := l.join(); err != nil {
			errc <- err
			return
		}
		errc <- cmd.Start()
	}()
	return <-errc
}

// join makes this thread's children join l's namespaces.
func (l launch) join() error {
	if l.joinPID != "" {
		f, err := os.Open(l.joinPID)
		if err != nil {
			return fmt.Errorf("open PID namespace: %w", err)
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWPID); err != nil {
			return fmt.Errorf("join PID namespace %s: %w", l.joinPID, err)
		}
	}
	if l.joinInit != 0 {
		fd, err := unix.PidfdOpen(l.joinInit, 0)
		if err != nil {
			return fmt.Errorf("open the container's init: %w", err)
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWPID|unix.CLONE_NEWUTS|unix.CLONE_NEWIPC|unix.CLONE_NEWCGROUP); err != nil {
			return fmt.Errorf("join the container's namespaces: %w", err)
		}
	}
	return nil
}

// ready waits for the init to say the container is made, or why not.
func (h *helper) ready(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { _ = h.status.SetReadDeadline(time.Now()) })
	defer stop()
	var b [1]byte
	n, err := h.status.Read(b[:])
	if n == 1 && b[0] == cinit.Ready {
		return nil
	}
	if n == 0 && err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("wait for the container init: %w", errors.Join(err, ctx.Err()))
	}
	rest, _ := io.ReadAll(h.status)
	return initError(append(b[:n], rest...))
}

// readExec waits for the init's exec: its status pipe closes unwritten,
// or carries why the exec failed.
func readExec(ctx context.Context, status *os.File) error {
	stop := context.AfterFunc(ctx, func() { _ = status.SetReadDeadline(time.Now()) })
	defer stop()
	msg, err := io.ReadAll(status)
	if err != nil {
		return fmt.Errorf("wait for the exec: %w", errors.Join(err, ctx.Err()))
	}
	if len(msg) > 0 {
		return initError(msg)
	}
	return nil
}

// initError is what the container init said before it exited.
func initError(msg []byte) error {
	if len(msg) == 0 {
		return errors.New("the container init ended without a word")
	}
	return fmt.Errorf("container init: %s", msg)
}

// kill ends a helper that failed, and reaps it.
func (h *helper) kill() {
	_ = h.cmd.Process.Kill()
	_, _ = h.cmd.Process.Wait()
	h.status.Close()
	if h.start != nil {
		h.start.Close()
	}
}

// pipes are the helper's pipes: the child's ends, and the agent's.
type pipes struct {
	child, own []*os.File
}

// add makes a pipe: the child reads it, or with childWrites writes it.
// It returns the agent's end.
func (p *pipes) add(childWrites bool) (*os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("make pipe: %w", err)
	}
	child, own := r, w
	if childWrites {
		child, own = w, r
	}
	p.child, p.own = append(p.child, child), append(p.own, own)
	return own, nil
}

func (p *pipes) closeChildEnds() { closeFiles(p.child); p.child = nil }
func (p *pipes) closeOwnEnds()   { closeFiles(p.own); p.own = nil }

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		if f != nil {
			f.Close()
		}
	}
}
