package container

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	runc "github.com/containerd/go-runc"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/server/guestfile"
)

// Container is one container, made by runc or the agent's own container
// init (eng), with its init process.
type Container struct {
	ID     string
	bundle string
	cgroup string // its cgroup, relative to the hierarchy's root
	eng    engine
	init   *proc
	disk   string // the serial of its root's disk, "" for a directory
	// volumes are the volume disks mounted for it.
	volumes []*api.VolumeDisk
	// Phases are how long its create's steps took (api.CreatePhases).
	Phases []*api.Phase

	startMu sync.Mutex
	started bool

	execs procs
}

// CreateOptions are a container's inputs besides its id.
type CreateOptions struct {
	// Spec is the OCI runtime spec as JSON, translated for the guest.
	Spec []byte
	// Rootfs is the container's root directory in the guest; RootDisk
	// the disk its root is on. Exactly one is set.
	Rootfs   string
	RootDisk *api.Rootfs
	// Files are the copies of the spec's bind sources, written before
	// runc runs.
	Files []*api.File
	// Volumes are disks mounted read-only for the spec's binds.
	Volumes []*api.VolumeDisk
	// Stdin gives the process a stdin pipe (a terminal always has one).
	Stdin bool
	// OwnInit runs it with the agent's container init, not runc.
	OwnInit bool
}

// Create writes the container's bundle and has runc create it: its init
// waits for Start.
func (m *Manager) Create(ctx context.Context, id string, o CreateOptions) (*Container, error) {
	if err := m.reserve(id); err != nil {
		return nil, err
	}
	c, err := m.create(ctx, id, o)
	m.release(id, c)
	return c, err
}

func (m *Manager) create(ctx context.Context, id string, o CreateOptions) (*Container, error) {
	clk := api.NewClock()
	if err := checkRoot(o); err != nil {
		return nil, fmt.Errorf("container %q: %w", id, err)
	}
	spec, err := guestSpec(id, o.Spec, m.cfg.CgroupParent)
	if err != nil {
		return nil, err
	}
	files, err := guestfile.Check(o.Files)
	if err != nil {
		return nil, fmt.Errorf("files of container %q: %w", id, err)
	}
	if err := subreaper(); err != nil {
		return nil, err
	}
	bundle := filepath.Join(m.cfg.StateDir, id)
	c := &Container{ID: id, bundle: bundle, cgroup: spec.Linux.CgroupsPath, eng: m.engine(bundle, o.OwnInit), execs: procs{m: map[string]*proc{}}}
	if o.RootDisk != nil {
		c.disk = o.RootDisk.Serial
	}
	if err := m.prepare(ctx, c, spec, o, files, clk); err != nil {
		return nil, err
	}
	pid, io, err := c.eng.create(ctx, c, spec, o.Stdin)
	clk.Lap(c.eng.createPhase())
	c.Phases = clk.Phases()
	if err == nil {
		if c.init, err = watch(id, pid, io, c.oomOnExit(ctx)); err != nil {
			_ = c.eng.remove(context.WithoutCancel(ctx), c)
			io.close()
		}
	}
	if err != nil {
		return nil, errors.Join(err, m.unprepare(c))
	}
	logger(ctx, id).WithField("pid", pid).Debug("container created")
	return c, nil
}

// prepare makes c's bundle: its dir, its root (a disk mounted in it),
// its files and its config.json. A failure undoes it all.
func (m *Manager) prepare(ctx context.Context, c *Container, spec *specs.Spec, o CreateOptions, files []*api.File, clk *api.Clock) error {
	if err := makeBundle(c.bundle); err != nil {
		return fmt.Errorf("container %q: %w", c.ID, err)
	}
	root, err := m.mountRoot(ctx, c.ID, c.bundle, o, clk)
	if err != nil {
		_ = os.RemoveAll(c.bundle)
		return fmt.Errorf("container %q: %w", c.ID, err)
	}
	spec.Root.Path = root
	clk.Lap(api.PhaseRoot)
	if err = m.mountVolumes(ctx, c, o); err != nil {
		err = fmt.Errorf("container %q: %w", c.ID, err)
	} else if err = guestfile.Write(files); err != nil {
		err = fmt.Errorf("files of container %q: %w", c.ID, err)
	} else if err = writeSpec(c.bundle, spec); err != nil {
		err = fmt.Errorf("container %q: %w", c.ID, err)
	}
	if err != nil {
		return errors.Join(err, m.unprepare(c))
	}
	clk.Lap(api.PhaseBundle)
	return nil
}

// unprepare unmounts c's volume disks and root, if from a disk, and
// removes its bundle. A bundle with a root still mounted stays: removing
// it would write into the root.
func (m *Manager) unprepare(c *Container) error {
	if err := m.unmountVolumes(c); err != nil {
		return err
	}
	if err := m.unmountRoot(c); err != nil {
		return err
	}
	if err := os.RemoveAll(c.bundle); err != nil {
		return fmt.Errorf("remove bundle of container %q: %w", c.ID, err)
	}
	return nil
}

// makeBundle makes the container's bundle dir.
func makeBundle(dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o711); err != nil {
		return fmt.Errorf("make bundle: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("make bundle: %w", err)
	}
	return nil
}

// writeSpec writes the spec as the bundle's config.json.
func writeSpec(dir string, spec *specs.Spec) error {
	data, err := json.Marshal(spec)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "config.json"), data, 0o600)
	}
	if err != nil {
		return fmt.Errorf("write config.json: %w", err)
	}
	return nil
}

// ioSetup is a process's stdio on its way to runc: pipes, or for a
// terminal a console socket on which runc sends the terminal back.
type ioSetup struct {
	pipes *stdio
	io    runc.IO
	sock  *runc.Socket
}

func newIOSetup(p *specs.Process, withStdin bool) (*ioSetup, error) {
	if p.Terminal {
		sock, err := runc.NewTempConsoleSocket()
		if err != nil {
			return nil, fmt.Errorf("make console socket: %w", err)
		}
		return &ioSetup{sock: sock}, nil
	}
	pio, pipes, err := newPipes(int(p.User.UID), int(p.User.GID), withStdin)
	if err != nil {
		return nil, err
	}
	return &ioSetup{pipes: pipes, io: pio}, nil
}

// done, once runc ran, returns the agent's side of the stdio (ok) or
// releases everything (!ok).
func (s *ioSetup) done(ok bool) (*stdio, error) {
	if s.sock != nil {
		defer s.sock.Close()
		if ok {
			return newTerminal(s.sock)
		}
		return nil, nil
	}
	if !ok {
		s.pipes.close()
		return nil, nil
	}
	return s.pipes, nil
}
