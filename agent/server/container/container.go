// Package container runs the containers of a pod inside its VM: each is a
// container as runc makes it (namespaces, cgroup, capabilities, seccomp,
// masked and read-only paths), from a bundle the agent writes, driven
// with go-runc as containerd's runc shim drives runc on a host.
package container

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/containerd/containerd/v2/pkg/identifiers"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// Config says where the manager's runc, its state and the containers'
// cgroups are.
type Config struct {
	Runc         string // the runc binary
	Cinit        string // the agent's container init (cmd/cocoon-cinit)
	RuncRoot     string // runc's --root
	StateDir     string // bundles, one dir per container
	CgroupParent string // the containers' cgroups are under it
	// Roots mounts roots from disks; nil refuses a container whose root
	// is a disk.
	Roots Roots
}

// DefaultConfig is the guest's.
var DefaultConfig = Config{
	Runc:         "/usr/bin/runc",
	Cinit:        "/sbin/cocoon-cinit",
	RuncRoot:     "/run/runc",
	StateDir:     "/run/cocoon/containers",
	CgroupParent: "/cocoon",
}

// Manager runs containers.
type Manager struct {
	cfg Config
	// cinit is the sealed copy of cfg.Cinit the own init runs, made once.
	cinit func() (*os.File, error)

	mu         sync.Mutex
	containers map[string]*Container // nil value: being created
	disks      map[string]string     // serial of a root's disk: its container
}

// New returns a manager; nothing is done until a container is created.
func New(cfg Config) *Manager {
	return &Manager{cfg: cfg, containers: map[string]*Container{}, disks: map[string]string{},
		cinit: sync.OnceValues(func() (*os.File, error) { return sealedCopy(cfg.Cinit) })}
}

// subreaper makes the agent the parent of the processes runc leaves
// behind: its init and execs, once runc exits. It waits for them by pid
// (a pidfd), as it waits for its own processes, so no reaper takes
// another's status. Set at the first container, or a pod VM's warm-up
// (Warm): an agent without any keeps its old orphans going to init.
var subreaper = sync.OnceValue(func() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("become a child subreaper: %w", err)
	}
	return nil
})

// reserve claims id for a container being created.
func (m *Manager) reserve(id string) error {
	if err := identifiers.Validate(id); err != nil {
		return fmt.Errorf("container id: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.containers[id]; ok {
		return fmt.Errorf("container %q: %w", id, errdefs.ErrAlreadyExists)
	}
	m.containers[id] = nil
	return nil
}

// release ends a reservation: c is the container made, or nil.
func (m *Manager) release(id string, c *Container) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c == nil {
		delete(m.containers, id)
		return
	}
	m.containers[id] = c
}

// Get returns the container id; one still being created is NotFound.
func (m *Manager) Get(id string) (*Container, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c := m.containers[id]; c != nil {
		return c, nil
	}
	return nil, fmt.Errorf("container %q: %w", id, errdefs.ErrNotFound)
}

// runcError is err with runc's last logged error, which says what went
// wrong when runc's own stderr went to the container's.
func runcError(bundle string, err error) error {
	data, rerr := os.ReadFile(filepath.Join(bundle, "log.json"))
	if rerr != nil {
		return err
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if msg := lastError(lines[i]); msg != "" {
			return fmt.Errorf("%w: runc: %s", err, msg)
		}
	}
	return err
}

// lastError is the message of a runc log line at level error, or "".
func lastError(line string) string {
	var l struct{ Level, Msg string }
	if json.Unmarshal([]byte(line), &l) != nil || l.Level != "error" {
		return ""
	}
	return l.Msg
}

// readPid reads the pid file runc wrote.
func readPid(path string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read pid: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("read pid from %q: %w", data, errors.Join(err, errdefs.ErrUnknown))
	}
	return pid, nil
}

func logger(ctx context.Context, id string) *log.Entry {
	return log.G(ctx).WithField("container", id)
}
