package container

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"

	"github.com/containerd/console"
	"github.com/containerd/errdefs"
	runc "github.com/containerd/go-runc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/cinit"
)

// exec runs p in the container: the container init, started in the
// init's PID, UTS, IPC and cgroup namespaces and cgroup, joins its mount
// namespace and execs p with the container's seccomp filter and OOM
// score, and its capabilities when p names none (runc's exec).
func (e *ownInit) exec(ctx context.Context, c *Container, _ string, p *specs.Process, withStdin bool) (int, *stdio, error) {
	proc, err := planProcess(p, nil)
	if err != nil {
		return 0, nil, err
	}
	proc.Seccomp, proc.OOMScoreAdj = e.seccomp, e.oomAdj
	if proc.Caps == nil {
		proc.Caps = e.caps
	}
	mnt, err := os.Open("/proc/" + strconv.Itoa(c.init.pid) + "/ns/mnt")
	if err != nil {
		return 0, nil, fmt.Errorf("open the container's mount namespace: %w", err)
	}
	defer mnt.Close()
	io, child, err := newChildStdio(p, withStdin)
	if err != nil {
		return 0, nil, err
	}
	h, err := e.launch(launch{cfg: &cinit.Config{Process: *proc}, cgroup: c.cgroup, stdio: child, joinInit: c.init.pid, mountNS: mnt})
	child.close()
	if err == nil {
		if err = readExec(ctx, h.status); err != nil {
			h.kill()
			err = fmt.Errorf("%w: %w", err, errdefs.ErrFailedPrecondition)
		}
	}
	if err != nil {
		io.close()
		return 0, nil, err
	}
	h.status.Close()
	return h.cmd.Process.Pid, io, nil
}

// childStdio is the child's side of a process's stdio: pipes, or the
// slave of a terminal, also bound at the container's /dev/console.
type childStdio struct {
	files    [3]*os.File
	pipes    runc.IO
	terminal bool
	console  string
}

// newChildStdio makes a process's stdio: the agent's side, and the
// child's, which the caller closes once the child has it.
func newChildStdio(p *specs.Process, withStdin bool) (*stdio, *childStdio, error) {
	if p.Terminal {
		return newChildTerminal(p.User)
	}
	pio, s, err := newPipes(int(p.User.UID), int(p.User.GID), withStdin)
	if err != nil {
		return nil, nil, err
	}
	var cmd exec.Cmd
	pio.Set(&cmd)
	c := &childStdio{pipes: pio}
	for i, f := range []any{cmd.Stdin, cmd.Stdout, cmd.Stderr} {
		c.files[i], _ = f.(*os.File)
	}
	return s, c, nil
}

// newChildTerminal opens a terminal whose slave the process's user owns.
func newChildTerminal(u specs.User) (*stdio, *childStdio, error) {
	master, path, err := console.NewPty()
	if err != nil {
		return nil, nil, fmt.Errorf("make terminal: %w", err)
	}
	defer master.Close()
	s, err := keepMaster(master)
	if err != nil {
		return nil, nil, err
	}
	slave, err := os.OpenFile(path, os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err == nil {
		err = slave.Chown(int(u.UID), int(u.GID))
	}
	if err != nil {
		s.close()
		return nil, nil, fmt.Errorf("open terminal: %w", err)
	}
	return s, &childStdio{files: [3]*os.File{slave, slave, slave}, terminal: true, console: path}, nil
}

// close releases the child's ends once the child has its copies.
func (c *childStdio) close() {
	if c.pipes != nil {
		if sc, ok := c.pipes.(runc.StartCloser); ok {
			_ = sc.CloseAfterStart()
		}
		return
	}
	c.files[0].Close()
}
