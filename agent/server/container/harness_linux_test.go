package container

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/server/procio"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// managers numbers the tests' managers, each with a cgroup parent of its own.
var managers atomic.Int64

// testManager is a manager on the host's runc (Debian's, cgroup v1 here),
// with its state, runc's and the containers' cgroups the test's own, all
// removed at the end.
func testManager(t *testing.T) *Manager {
	t.Helper()
	testenv.RequireRoot(t)
	cfg := Config{
		Runc:         testenv.LookPath(t, "runc"),
		RuncRoot:     t.TempDir(),
		StateDir:     filepath.Join(t.TempDir(), "containers"),
		CgroupParent: fmt.Sprintf("/cocoon-container-test-%d-%d", os.Getpid(), managers.Add(1)),
	}
	m := New(cfg)
	t.Cleanup(func() {
		m.mu.Lock()
		ids := make([]string, 0, len(m.containers))
		for id := range m.containers {
			ids = append(ids, id)
		}
		m.mu.Unlock()
		for _, id := range ids {
			c, err := m.Get(id)
			if err == nil && !c.init.exited() {
				_ = c.Signal(context.Background(), "", unix.SIGKILL, true)
				select {
				case <-c.init.done:
				case <-time.After(time.Minute):
					t.Errorf("cleanup: %s outlived SIGKILL", id)
				}
			}
			if err := m.Delete(context.Background(), id); err != nil {
				t.Errorf("cleanup: delete %s: %v", id, err)
			}
		}
		for _, dir := range cgroupDirs(cfg.CgroupParent) {
			if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("cleanup: remove cgroup %s: %v", dir, err)
			}
		}
	})
	return m
}

// cgroupDirs are the directories of the cgroup at path: one per v1
// hierarchy, or the one of v2.
func cgroupDirs(path string) []string {
	if cgroups.Mode() == cgroups.Unified {
		return []string{filepath.Join(cgroupRoot, path)}
	}
	var dirs []string
	entries, _ := os.ReadDir(cgroupRoot)
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, filepath.Join(cgroupRoot, e.Name(), path))
		}
	}
	return dirs
}

// busyboxRoot makes a root file system of the host's static busybox and
// its applets, with /etc/secret for the masked path test.
func busyboxRoot(t *testing.T) string {
	t.Helper()
	bb := testenv.LookPath(t, "busybox")
	root := t.TempDir()
	bin := filepath.Join(root, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "busybox"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bb, "--list").Output()
	if err != nil {
		t.Fatalf("busybox --list: %v", err)
	}
	for _, applet := range strings.Fields(string(out)) {
		if err := os.Symlink("busybox", filepath.Join(bin, applet)); err != nil && !os.IsExist(err) {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "secret"), []byte("s3cret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

// specJSON is containerd's default spec for a container, as ctr run
// would give the shim, with opts applied.
func specJSON(t *testing.T, id string, opts ...oci.SpecOpts) []byte {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), "cocoon-test")
	s, err := oci.GenerateSpec(ctx, nil, &containers.Container{ID: id}, append([]oci.SpecOpts{oci.WithDefaultPathEnv}, opts...)...)
	if err != nil {
		t.Fatalf("generate spec: %v", err)
	}
	data, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// readAll reads a process's stream to its end.
func readAll(t *testing.T, s *procio.Output) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var b strings.Builder
	for {
		data, eof, err := s.Read(ctx, 0)
		if err != nil {
			t.Fatalf("read output: %v (so far %q)", err, b.String())
		}
		b.Write(data)
		if eof {
			return b.String()
		}
	}
}

// waitExit waits for a process of c.
func waitExit(t *testing.T, c *Container, execID string) Exit {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e, err := c.Wait(ctx, execID)
	if err != nil {
		t.Fatalf("wait for %q of %s: %v", execID, c.ID, err)
	}
	return e
}

// runContainer creates and starts a container running args and returns
// its stdout, stderr and exit once it ended; the container is deleted.
func runContainer(t *testing.T, m *Manager, id string, rootfs string, opts ...oci.SpecOpts) (string, string, Exit) {
	t.Helper()
	ctx := context.Background()
	c, err := m.Create(ctx, id, CreateOptions{Spec: specJSON(t, id, opts...), Rootfs: rootfs})
	if err != nil {
		t.Fatalf("create %s: %v", id, err)
	}
	if _, err := c.Start(ctx); err != nil {
		t.Fatalf("start %s: %v", id, err)
	}
	stdout, stderr := readAll(t, c.init.io.stdout), readAll(t, c.init.io.stderr)
	e := waitExit(t, c, "")
	if err := m.Delete(ctx, id); err != nil {
		t.Fatalf("delete %s: %v", id, err)
	}
	return stdout, stderr, e
}
