package container

import (
	"context"
	"encoding/json"
	"fmt"
	"syscall"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// oomOnExit flags the init's exit as an OOM kill when the OOM killer
// killed in the container's cgroup, read before runc deletes it.
func (c *Container) oomOnExit(ctx context.Context) func(*Exit) {
	return func(e *Exit) {
		n, err := oomKills(c.cgroup)
		if err != nil {
			logger(ctx, c.ID).WithError(err).Warn("cannot tell whether the container was OOM-killed")
			return
		}
		e.OOMKilled = n > 0
	}
}

// Start runs the container's process.
func (c *Container) Start(ctx context.Context) (int, error) {
	c.startMu.Lock()
	defer c.startMu.Unlock()
	if c.started {
		return 0, fmt.Errorf("container %q has started: %w", c.ID, errdefs.ErrFailedPrecondition)
	}
	if c.init.exited() {
		return 0, fmt.Errorf("container %q has exited: %w", c.ID, errdefs.ErrFailedPrecondition)
	}
	if err := c.eng.start(ctx, c); err != nil {
		return 0, fmt.Errorf("start container %q: %w: %w", c.ID, err, errdefs.ErrFailedPrecondition)
	}
	c.started = true
	return c.init.pid, nil
}

// process returns the container's init (execID "") or one of its execs.
func (c *Container) process(execID string) (*proc, error) {
	if execID == "" {
		return c.init, nil
	}
	c.execs.mu.Lock()
	defer c.execs.mu.Unlock()
	if p := c.execs.m[execID]; p != nil {
		return p, nil
	}
	return nil, fmt.Errorf("process %q of container %q: %w", execID, c.ID, errdefs.ErrNotFound)
}

// Signal signals the init (with all, every process of the container) or
// an exec.
func (c *Container) Signal(ctx context.Context, execID string, sig syscall.Signal, all bool) error {
	p, err := c.process(execID)
	if err != nil {
		return err
	}
	if execID != "" {
		return p.signal(sig)
	}
	if p.exited() && !all {
		return fmt.Errorf("container %q has exited: %w", c.ID, errdefs.ErrNotFound)
	}
	if err := c.eng.kill(ctx, c, sig, all); err != nil {
		if p.exited() {
			return fmt.Errorf("container %q has exited: %w", c.ID, errdefs.ErrNotFound)
		}
		return fmt.Errorf("signal container %q: %w", c.ID, err)
	}
	return nil
}

// Wait waits for the init or an exec to exit.
func (c *Container) Wait(ctx context.Context, execID string) (Exit, error) {
	p, err := c.process(execID)
	if err != nil {
		return Exit{}, err
	}
	select {
	case <-p.done:
		return p.exit, nil
	case <-ctx.Done():
		return Exit{}, fmt.Errorf("wait for %q of container %q: %w", execID, c.ID, ctx.Err())
	}
}

// Update changes the container's resources, as `runc update` does.
func (c *Container) Update(ctx context.Context, data []byte) error {
	r, err := resources(c.ID, data)
	if err != nil {
		return err
	}
	if c.init.exited() {
		return fmt.Errorf("container %q has exited: %w", c.ID, errdefs.ErrFailedPrecondition)
	}
	if err := c.eng.update(ctx, c, r); err != nil {
		return fmt.Errorf("update container %q: %w: %w", c.ID, err, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// Delete removes the container once its init has exited, or was never
// started: the engine kills one that waits for its start.
func (m *Manager) Delete(ctx context.Context, id string) error {
	c, err := m.Get(id)
	if err != nil {
		return err
	}
	c.startMu.Lock()
	defer c.startMu.Unlock()
	if c.started && !c.init.exited() {
		return fmt.Errorf("container %q is running: %w", id, errdefs.ErrFailedPrecondition)
	}
	if err := c.eng.remove(ctx, c); err != nil {
		return fmt.Errorf("delete container %q: %w", id, err)
	}
	<-c.init.done
	c.closeAll()
	err = m.unprepare(c)
	m.mu.Lock()
	delete(m.containers, id)
	m.mu.Unlock()
	return err
}

// closeAll releases the stdio of the init and of every exec.
func (c *Container) closeAll() {
	c.init.io.close()
	c.execs.mu.Lock()
	defer c.execs.mu.Unlock()
	for id, p := range c.execs.m {
		if p != nil {
			p.io.close()
		}
		delete(c.execs.m, id)
	}
}

// resources reads an OCI LinuxResources JSON.
func resources(id string, data []byte) (*specs.LinuxResources, error) {
	if len(data) > MaxSpecSize {
		return nil, fmt.Errorf("resources of %q are %d bytes, expected at most %d: %w", id, len(data), MaxSpecSize, errdefs.ErrInvalidArgument)
	}
	var r specs.LinuxResources
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("resources of %q: expected OCI LinuxResources JSON: %v: %w", id, err, errdefs.ErrInvalidArgument)
	}
	return &r, nil
}
