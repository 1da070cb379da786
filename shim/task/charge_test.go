package task

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/cgroups/v3"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// testCgroup makes a VM cgroup without limits, as vmSetup.starting does,
// and removes it at cleanup.
func testCgroup(t *testing.T, name string) (VMCgroup, string) {
	t.Helper()
	testenv.RequireRoot(t)
	path := fmt.Sprintf("/cocoon-test-%s-%d", name, os.Getpid())
	cg, err := NewCgroup(path, &specs.LinuxResources{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cg.Delete(); err != nil {
			t.Errorf("delete cgroup %s: %v", path, err)
		}
	})
	return cg, path
}

// TestChargeFill: what the fill allocates is charged to the VM's cgroup,
// the shim is back in its own cgroup afterwards, and a process another
// goroutine starts meanwhile is not born in the VM's cgroup.
func TestChargeFill(t *testing.T) {
	cg, path := testCgroup(t, "charge")
	before := cgroupLines(t, "self")
	const size = 16 << 20
	var (
		memfd *os.File
		other = make(chan *exec.Cmd)
	)
	err := cg.Charge(func() error {
		fd, err := unix.MemfdCreate("test-fill", unix.MFD_CLOEXEC)
		if err != nil {
			return err
		}
		memfd = os.NewFile(uintptr(fd), "test-fill")
		go func() {
			cmd := exec.Command("sleep", "30")
			if err := cmd.Start(); err != nil {
				t.Error(err)
			}
			other <- cmd
		}()
		time.Sleep(100 * time.Millisecond) // the goroutine's fork waits for the fill
		_, err = memfd.Write(make([]byte, size))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer memfd.Close()
	cmd := <-other
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if used := memoryUsage(t, path); used < size {
		t.Errorf("the VM's cgroup uses %d bytes after a fill of %d", used, size)
	}
	if after := cgroupLines(t, "self"); after != before {
		t.Errorf("the shim's cgroups after the fill:\n%s\nwant as before:\n%s", after, before)
	}
	if lines := cgroupLines(t, strconv.Itoa(cmd.Process.Pid)); strings.Contains(lines, path) {
		t.Errorf("a process started during the fill is in the VM's cgroup:\n%s", lines)
	}
}

// TestChargeStart: the hypervisor is born in every hierarchy of the VM's
// cgroup, and no thread of the shim stays there.
func TestChargeStart(t *testing.T) {
	cg, path := testCgroup(t, "start")
	cmd := exec.Command("sleep", "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cg.Start(cmd.SysProcAttr, cmd.Start); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for _, line := range strings.Split(cgroupLines(t, strconv.Itoa(cmd.Process.Pid)), "\n") {
		// v1 hierarchies other than the unified one of a hybrid host, or
		// v2's only one.
		if f := strings.SplitN(line, ":", 3); len(f) == 3 && (f[1] != "" || cgroups.Mode() == cgroups.Unified) && f[2] != path {
			t.Errorf("the hypervisor started in %q, want %s in every hierarchy", line, path)
		}
	}
	threads, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, th := range threads {
		if lines := cgroupLines(t, "self/task/"+th.Name()); strings.Contains(lines, path) {
			t.Errorf("shim thread %s stayed in the VM's cgroup:\n%s", th.Name(), lines)
		}
	}
}

// TestChargeStartV2 starts a process with CLONE_INTO_CGROUP in a cgroup of
// the v2 hierarchy: the only one of a unified host, the unified one of a
// hybrid host.
func TestChargeStartV2(t *testing.T) {
	testenv.RequireRoot(t)
	root := "/sys/fs/cgroup/unified"
	if cgroups.Mode() == cgroups.Unified {
		root = "/sys/fs/cgroup"
	}
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		testenv.Unavailable(t, "no cgroup v2 hierarchy at "+root)
	}
	path := fmt.Sprintf("/cocoon-test-v2-%d", os.Getpid())
	dir := filepath.Join(root, path)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	cmd := exec.Command("sleep", "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	if err := (cgroupV2{dir: dir}).Start(cmd.SysProcAttr, cmd.Start); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if lines := cgroupLines(t, strconv.Itoa(cmd.Process.Pid)); !strings.Contains(lines, "0::"+path+"\n") {
		t.Errorf("the process started in:\n%s\nwant 0::%s", lines, path)
	}
}

// cgroupLines is /proc/<of>/cgroup.
func cgroupLines(t *testing.T, of string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("/proc", of, "cgroup"))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// memoryUsage reads the memory usage of the cgroup at path (v1 or v2).
func memoryUsage(t *testing.T, path string) int64 {
	t.Helper()
	for _, f := range []string{
		filepath.Join("/sys/fs/cgroup/memory", path, "memory.usage_in_bytes"),
		filepath.Join("/sys/fs/cgroup", path, "memory.current"),
	} {
		if data, err := os.ReadFile(f); err == nil {
			n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
			if err != nil {
				t.Fatalf("parse %s: %v", f, err)
			}
			return n
		}
	}
	t.Fatalf("no memory usage file for cgroup %s", path)
	return 0
}
