package container

import (
	"context"
	"fmt"

	"github.com/containerd/containerd/v2/pkg/identifiers"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// ExecOptions are an exec's inputs besides its id.
type ExecOptions struct {
	// Process is the OCI process as JSON, as containerd gives the shim.
	Process []byte
	// Stdin gives the process a stdin pipe (a terminal always has one).
	Stdin bool
}

// Exec runs a process in the running container, as `runc exec --detach`
// does; the agent is then its parent.
func (c *Container) Exec(ctx context.Context, execID string, o ExecOptions) (int, error) {
	if err := identifiers.Validate(execID); err != nil {
		return 0, fmt.Errorf("exec id: %w", err)
	}
	spec, err := processSpec(execID, o.Process)
	if err != nil {
		return 0, err
	}
	if err := c.reserveExec(execID); err != nil {
		return 0, err
	}
	p, err := c.exec(ctx, execID, spec, o.Stdin)
	c.execs.mu.Lock()
	if err != nil {
		delete(c.execs.m, execID)
	} else {
		c.execs.m[execID] = p
	}
	c.execs.mu.Unlock()
	if err != nil {
		return 0, err
	}
	return p.pid, nil
}

func (c *Container) reserveExec(execID string) error {
	c.startMu.Lock()
	running := c.started && !c.init.exited()
	c.startMu.Unlock()
	if !running {
		return fmt.Errorf("container %q is not running: %w", c.ID, errdefs.ErrFailedPrecondition)
	}
	c.execs.mu.Lock()
	defer c.execs.mu.Unlock()
	if _, ok := c.execs.m[execID]; ok {
		return fmt.Errorf("process %q of container %q: %w", execID, c.ID, errdefs.ErrAlreadyExists)
	}
	c.execs.m[execID] = nil
	return nil
}

func (c *Container) exec(ctx context.Context, execID string, spec *specs.Process, withStdin bool) (*proc, error) {
	pid, io, err := c.eng.exec(ctx, c, execID, spec, withStdin)
	if err != nil {
		return nil, fmt.Errorf("exec %q in %q: %w", execID, c.ID, err)
	}
	p, err := watch(execID, pid, io, nil)
	if err != nil {
		io.close()
		return nil, fmt.Errorf("exec %q in %q: %w", execID, c.ID, err)
	}
	return p, nil
}

// DeleteExec forgets an exited exec and closes its stdio.
func (c *Container) DeleteExec(execID string) error {
	p, err := c.process(execID)
	if err != nil {
		return err
	}
	if !p.exited() {
		return fmt.Errorf("process %q of container %q is running: %w", execID, c.ID, errdefs.ErrFailedPrecondition)
	}
	c.execs.mu.Lock()
	delete(c.execs.m, execID)
	c.execs.mu.Unlock()
	p.io.close()
	return nil
}
