package firecracker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// Files in a VM's run directory.
const (
	apiSock   = "api.sock"
	vsockSock = "vsock.sock"
	uffdSock  = "uffd.sock"
	memCopy   = "memory"
	vmmLog    = "firecracker.log"
)

// maxSockPath is the longest unix socket path (sun_path less the NUL).
const maxSockPath = 107

// socketPoll is how often spawn looks for the API socket: Firecracker
// binds it itself and takes no listening fd.
const socketPoll = 2 * time.Millisecond

// Default bounds for waits whose context has no deadline of its own: a
// hypervisor that never serves its API or never answers a request must
// not hang the caller.
const (
	spawnTimeout = 10 * time.Second
	callTimeout  = 2 * time.Minute
)

// withDefaultTimeout bounds ctx by d unless it already has a deadline.
func withDefaultTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// process is one supervised hypervisor process. Its exit status is
// collected once, by the goroutine started with it, and kept for every Wait.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// spawn starts binary with args in runDir, its output in runDir's log. The
// process gets its own session: a restored VM must outlive a crashed shim.
func spawn(binary string, args []string, runDir string) (*process, error) {
	logf, err := os.OpenFile(filepath.Join(runDir, vmmLog), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open hypervisor log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(binary, args...)
	cmd.Dir = runDir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", binary, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// waitSocket returns once something accepts connections on path, failing
// early if the process exits or ctx ends.
func (p *process) waitSocket(ctx context.Context, path string) error {
	ctx, cancel := withDefaultTimeout(ctx, spawnTimeout)
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

func (p *process) pid() int { return p.cmd.Process.Pid }

// kill sends SIGKILL unless the process has already been reaped.
func (p *process) kill() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill hypervisor pid %d: %w", p.pid(), err)
	}
	return nil
}

// wait blocks until the process has exited or ctx ends.
func (p *process) wait(ctx context.Context) error {
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for hypervisor pid %d: %w", p.pid(), ctx.Err())
	}
}

func checkSockPath(path string) error {
	if len(path) > maxSockPath {
		return fmt.Errorf("socket path %s is %d bytes: unix sockets allow %d", path, len(path), maxSockPath)
	}
	return nil
}
