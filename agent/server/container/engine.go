package container

import (
	"context"
	"path/filepath"
	"syscall"

	runc "github.com/containerd/go-runc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// engine makes a container's processes and drives them: runc, or the
// agent's own container init (ownInit). The Container keeps what both
// share: its bundle, root, stdio and the processes it waits for.
type engine interface {
	// createPhase names create's phase (api.CreatePhases).
	createPhase() string
	// create makes the container, its init waiting for start.
	create(ctx context.Context, c *Container, spec *specs.Spec, withStdin bool) (int, *stdio, error)
	// start lets the init run the container's process.
	start(ctx context.Context, c *Container) error
	// exec runs p in the running container.
	exec(ctx context.Context, c *Container, execID string, p *specs.Process, withStdin bool) (int, *stdio, error)
	// kill signals the init, or with all every process of the container.
	kill(ctx context.Context, c *Container, sig syscall.Signal, all bool) error
	update(ctx context.Context, c *Container, r *specs.LinuxResources) error
	// remove kills what is left of the container and removes its
	// cgroup and state.
	remove(ctx context.Context, c *Container) error
}

// engine is a container's engine: its own init's, or runc's with the
// container's log in its bundle.
func (m *Manager) engine(bundle string, own bool) engine {
	if own {
		return &ownInit{exe: m.cinit}
	}
	return runcEngine{rt: &runc.Runc{
		Command:      m.cfg.Runc,
		Root:         m.cfg.RuncRoot,
		Log:          filepath.Join(bundle, "log.json"),
		LogFormat:    runc.JSON,
		PdeathSignal: unix.SIGKILL,
	}}
}
