package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/cgroups/v3"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/ctrdtest"
)

// TestCgroupHoldsGuestMemory restores in copy and mmap mode under a memory
// limit, with containerd (and so the shims it starts) in a memory cgroup of
// the test's: the VM's cgroup must hold the guest's memory and all of
// QEMU's own, and containerd's cgroup must not grow by the guest's memory.
// Before the fix the shim filled a copy's memfd in its own cgroup and QEMU
// ran its start-up and load there before it was moved.
func TestCgroupHoldsGuestMemory(t *testing.T) {
	if cgroups.Mode() == cgroups.Unified {
		t.Fatal("this test reads cgroup v1 memory files; the host runs cgroup v2 only")
	}
	own := newMemoryCgroup(t)
	c := stack(t, "[restore]\nallow_annotation = true\n")
	pid := c.ContainerdPID()
	if pid == 0 {
		t.Fatal("the stack runs no containerd")
	}
	own.enter(t, pid)
	guest := guestData(t, c)
	limit := strconv.Itoa(512 << 20)
	for _, mode := range []string{"copy", "mmap"} {
		t.Run(mode, func(t *testing.T) {
			id := "cg-" + mode
			before := own.usage(t)
			flags := []string{"-d", "--memory-limit", limit, "--annotation", "io.cocoon.restore-mode=" + mode}
			if out, err := run(c, flags, id, "sleep", "600"); err != nil {
				t.Fatalf("ctr run: %v\n%s", err, out)
			}
			t.Cleanup(func() { removeTask(t, c, id) })
			grown := own.usage(t) - before
			pid, _ := taskPID(t, c, id)
			// QEMU's memory only grows while its guest runs: read it
			// first, the cgroup's right after.
			anon := procStatus(t, pid, "RssAnon")
			vm := memoryStat(t, filepath.Join("/sys/fs/cgroup/memory", ctrdtest.Namespace, id))
			t.Logf("%s: guest data %d MiB; containerd's cgroup grew %d MiB; VM cgroup rss %d MiB, shmem %d MiB, cache %d MiB; QEMU RssAnon %d MiB",
				mode, guest>>20, grown>>20, vm["rss"]>>20, vm["shmem"]>>20, vm["cache"]>>20, anon>>20)
			if grown > guest/2 {
				t.Errorf("containerd's cgroup grew by %d MiB across the create, want well under the guest's %d MiB", grown>>20, guest>>20)
			}
			// Every anonymous page QEMU maps was charged where QEMU was
			// when it faulted it in: all of them in the VM's cgroup only
			// if QEMU was born there.
			if slack := int64(1 << 20); vm["rss"]+slack < anon {
				t.Errorf("the VM's cgroup holds %d KiB of anonymous memory, QEMU maps %d KiB: QEMU allocated outside it", vm["rss"]>>10, anon>>10)
			}
			if mode == "copy" && vm["shmem"] < guest {
				t.Errorf("the VM's cgroup holds %d MiB of shared memory, want the copy's memfd of %d MiB", vm["shmem"]>>20, guest>>20)
			}
		})
	}
}

// memoryCgroup is a v1 memory cgroup the test made.
type memoryCgroup struct{ dir string }

// newMemoryCgroup makes a memory cgroup; cleanup moves whatever is left in
// it back to the test's own and removes it.
func newMemoryCgroup(t *testing.T) memoryCgroup {
	t.Helper()
	dir := filepath.Join("/sys/fs/cgroup/memory", fmt.Sprintf("cocoon-e2e-cg-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	back := filepath.Join("/sys/fs/cgroup/memory", ownMemoryCgroup(t))
	t.Cleanup(func() {
		var err error
		for range 50 {
			procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			for _, p := range strings.Fields(string(procs)) {
				os.WriteFile(filepath.Join(back, "cgroup.procs"), []byte(p), 0)
			}
			if err = os.Remove(dir); err == nil || errors.Is(err, fs.ErrNotExist) {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Errorf("remove cgroup %s: %v", dir, err)
	})
	return memoryCgroup{dir: dir}
}

func (m memoryCgroup) enter(t *testing.T, pid int) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(m.dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		t.Fatalf("move pid %d into %s: %v", pid, m.dir, err)
	}
}

func (m memoryCgroup) usage(t *testing.T) int64 {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(m.dir, "memory.usage_in_bytes"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// ownMemoryCgroup is the test process's v1 memory cgroup path.
func ownMemoryCgroup(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.SplitN(line, ":", 3); len(f) == 3 && f[1] == "memory" {
			return f[2]
		}
	}
	t.Fatal("no memory cgroup in /proc/self/cgroup")
	return ""
}

// memoryStat reads the v1 memory.stat of the cgroup dir.
func memoryStat(t *testing.T, dir string) map[string]int64 {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "memory.stat"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	stat := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), " "); ok {
			stat[k], _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return stat
}

// procStatus reads a "kB" field of /proc/PID/status, in bytes.
func procStatus(t *testing.T, pid int, field string) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("parse %s of %d: %v", field, pid, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// guestData is the data the test image's guest memory holds: what the
// snapshotter's flat memory file of its chain allocates (a copy restore's
// memfd holds the same), built by a first run.
func guestData(t *testing.T, c *ctrdtest.Containerd) int64 {
	t.Helper()
	if out, err := run(c, []string{"--rm"}, "cg-stage", "true"); err != nil {
		t.Fatalf("ctr run: %v\n%s", err, out)
	}
	dir := filepath.Join(c.SnapshotterRoot, "flat")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var data int64
	for _, e := range entries {
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(dir, e.Name()), &st); err == nil && e.Type().IsRegular() {
			data = max(data, st.Blocks*512)
		}
	}
	if data == 0 {
		t.Fatalf("no flat memory file in %s", dir)
	}
	return data
}

// removeTask kills and removes task id and its container.
func removeTask(t testing.TB, c *ctrdtest.Containerd, id string) {
	t.Helper()
	if _, err := c.Ctr("task", "kill", "--signal", "SIGKILL", id); err != nil {
		t.Errorf("kill %s: %v", id, err)
	}
	waitStatus(t, c, id, "STOPPED")
	if _, err := c.Ctr("task", "delete", id); err != nil {
		t.Errorf("delete task %s: %v", id, err)
	}
	if _, err := c.Ctr("container", "rm", id); err != nil {
		t.Errorf("remove container %s: %v", id, err)
	}
}
