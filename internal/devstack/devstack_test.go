package devstack

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

func TestDestroyRefusesOtherDirs(t *testing.T) {
	for _, dir := range []string{"/etc", "/tmp", "/tmp/other-1", "/tmp/ctrd-1/../../etc", "/var/tmp/ctrd-1"} {
		if err := Destroy(dir); err == nil || !strings.Contains(err.Error(), "not a devstack dir") {
			t.Errorf("Destroy(%q) = %v, want a not-a-devstack-dir error", dir, err)
		}
	}
}

func TestStartRequiresBinaries(t *testing.T) {
	if _, err := Start(t.Context(), Options{}); err == nil {
		t.Error("Start without a bin dir succeeded")
	}
	_, err := Start(t.Context(), Options{BinDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "containerd missing") {
		t.Errorf("Start with an empty bin dir = %v, want an error naming containerd", err)
	}
}

// TestDestroyKeptStack tears down a running stack from its dir alone, as
// `cocoon-bench demo --down` does, including a process the stack did not
// start itself (standing in for a re-parented shim).
func TestDestroyKeptStack(t *testing.T) {
	testenv.RequireRoot(t)
	bin := filepath.Dir(testenv.Bin(t, "containerd"))
	for _, name := range []string{"ctr", "cocoon-snapshotter", "containerd-shim-cocoon-v2", "cocoon-shim-server"} {
		testenv.Bin(t, name)
	}
	s, err := Start(t.Context(), Options{BinDir: bin, Namespace: "devstack-test"})
	if err != nil {
		t.Fatal(err)
	}
	dir := s.Dir
	t.Cleanup(func() {
		if _, err := os.Stat(dir); err == nil {
			s.Close()
		}
	})
	if _, err := s.Ctr(t.Context(), "namespaces", "create", "devstack-test"); err != nil {
		t.Fatal(err)
	}
	straggler := exec.Command("sleep", "600")
	straggler.Dir = s.RunDir
	if err := os.MkdirAll(s.RunDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := straggler.Start(); err != nil {
		t.Fatal(err)
	}
	go straggler.Wait()
	if err := Destroy(dir); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if left := Leftovers(dir); len(left) > 0 {
		t.Errorf("Destroy left:\n%s", strings.Join(left, "\n"))
	}
}

// TestRestart restarts containerd in place: a new process serves the same
// socket and dirs, keeps its log, and Close still leaves nothing behind.
func TestRestart(t *testing.T) {
	testenv.RequireRoot(t)
	bin := filepath.Dir(testenv.Bin(t, "containerd"))
	for _, name := range []string{"ctr", "cocoon-snapshotter", "containerd-shim-cocoon-v2", "cocoon-shim-server"} {
		testenv.Bin(t, name)
	}
	s, err := Start(t.Context(), Options{BinDir: bin, Namespace: "devstack-restart"})
	if err != nil {
		t.Fatal(err)
	}
	dir := s.Dir
	t.Cleanup(func() { s.Close() })
	if _, err := s.Ctr(t.Context(), "namespaces", "create", "kept"); err != nil {
		t.Fatal(err)
	}
	before := s.daemon(t, "containerd").cmd.Process.Pid
	if err := s.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	if after := s.daemon(t, "containerd").cmd.Process.Pid; after == before {
		t.Fatalf("containerd pid %d unchanged by Restart", after)
	}
	out, err := s.Ctr(t.Context(), "namespaces", "list", "--quiet")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "kept") {
		t.Fatalf("namespaces after the restart:\n%s\nwant the one made before it (same root)", out)
	}
	if logs := s.Logs(); strings.Count(logs, "containerd successfully booted") != 2 {
		t.Fatalf("containerd log does not hold both runs:\n%s", logs)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if left := Leftovers(dir); len(left) > 0 {
		t.Errorf("Close after Restart left:\n%s", strings.Join(left, "\n"))
	}
}

func (s *Stack) daemon(t *testing.T, name string) *proc {
	t.Helper()
	for _, p := range s.procs {
		if p.name == name {
			return p
		}
	}
	t.Fatalf("the stack runs no %s", name)
	return nil
}

// TestNamespaceCgroups: the stack claims only the namespace cgroup dirs
// missing when it starts, and removes only the empty ones.
func TestNamespaceCgroups(t *testing.T) {
	testenv.RequireRoot(t)
	ns := fmt.Sprintf("devstack-cg-%d", os.Getpid())
	t.Cleanup(func() {
		for _, dir := range cgroupDirs(t, ns) {
			_ = os.Remove(filepath.Join(dir, "busy"))
			_ = os.Remove(dir)
		}
	})
	for _, bad := range []string{"", "..", "a/b"} {
		if got := absentCgroups(bad); got != nil {
			t.Errorf("namespace %q claims cgroup dirs %v", bad, got)
		}
	}
	claimed := absentCgroups(ns)
	if len(claimed) == 0 {
		t.Fatal("no cgroup hierarchy is mounted to test with")
	}
	// The shims leave the namespace's dirs; one still has a task cgroup.
	for _, dir := range claimed {
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	busy := claimed[0]
	if err := os.Mkdir(filepath.Join(busy, "busy"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := absentCgroups(ns); len(got) != 0 {
		t.Fatalf("existing namespace dirs claimed: %v", got)
	}
	if err := removeEmptyCgroups(claimed); err != nil {
		t.Fatal(err)
	}
	for _, dir := range claimed {
		_, err := os.Stat(dir)
		if exists := err == nil; exists != (dir == busy) {
			t.Errorf("%s exists %v after the teardown, want %v (only the one in use stays)", dir, exists, dir == busy)
		}
	}
}

// cgroupDirs is ns's dir in every cgroup hierarchy.
func cgroupDirs(t *testing.T, ns string) []string {
	t.Helper()
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, m := range mounts {
		dirs = append(dirs, filepath.Join(m.Mountpoint, ns))
	}
	return dirs
}

// TestConfigHoldsOnlyChanges: the cocoon config the stack writes holds the
// keys that differ from the defaults, and reads back as the config given.
func TestConfigHoldsOnlyChanges(t *testing.T) {
	cfg := config.Default()
	cfg.Restore.AllowAnnotation = true
	cfg.Shim.RunDir = "/run/elsewhere"
	data, err := encodeChanges(cfg)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	if !strings.Contains(text, "allow_annotation = true") || !strings.Contains(text, "/run/elsewhere") || strings.Contains(text, "max_rootfs_size") {
		t.Errorf("config %q, want only the changed keys", text)
	}
	got, err := config.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, cfg) {
		t.Errorf("config read back as %+v, want %+v", got, cfg)
	}
	if data, err := encodeChanges(config.Default()); err != nil || strings.TrimSpace(string(data)) != "" {
		t.Errorf("defaults encode as %q (%v), want nothing", data, err)
	}
}
