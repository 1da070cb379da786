package e2e

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/ctrdtest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testimage"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/vm"
)

// TestPooledVM: with shim.pooled_vm, the spare a task's server starts
// restores that task's base ahead and warms it; the next ordinary image
// runs in it (its create claims the VM: no restore phases), reads its own
// image, and the spare's VM is the task's only hypervisor, in the task's
// cgroup (it waited in the pool's), under the normal scheduling policy.
// Containers started back to back, before the pooled VM is up or while it
// warms, run as well. A
// spare killed while it holds a pooled VM takes the VM with it, and the
// next spare's fill removes the run dir it left. A pooled VM that died
// waiting is passed over: the container restores its own. The killed
// spare's base snapshot lease is swept by the next fill.
func TestPooledVM(t *testing.T) {
	c, img := ordinaryStack(t, imageRef, "[shim]\npooled_vm = true")
	want := strings.TrimSpace(img.RandomContent)
	if out, err := runOrdinary(c, []string{"--rm"}, "first", "cat", testimage.RandomFile); err != nil || strings.TrimSpace(out) != want {
		t.Fatalf("first container: %q, %v", out, err)
	}
	// Right after: the pooled VM may be restoring (not taken), or warming
	// (taken once the step under way is done); either way the container
	// runs its own image.
	for i := range 2 {
		if out, err := runOrdinary(c, []string{"--rm"}, fmt.Sprintf("next%d", i), "cat", testimage.RandomFile); err != nil || strings.TrimSpace(out) != want {
			t.Fatalf("container right after another: %q, %v", out, err)
		}
	}
	claimed := false
	for round := 0; round < 3 && !claimed; round++ {
		dir, _ := awaitPooledVM(t, c)
		qemu := processUsing(dir, "qemu")
		if cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", qemu)); !regexp.MustCompile(`(?m):memory:/[^/]*-pool$`).Match(cg) {
			t.Errorf("a waiting pooled VM's cgroups %q: want the stack's pool cgroup (shim.pool_cgroup) for memory", cg)
		}
		id := fmt.Sprintf("claim%d", round)
		if _, err := runOrdinary(c, []string{"-d"}, id, "sleep", "600"); err != nil {
			t.Fatal(err)
		}
		phases := readReport(t, c, id).Phases
		t.Logf("round %d: %s", round, phaseList(phases))
		if claimed = hasPhase(phases, vm.PhaseClaim); claimed {
			checkClaimed(t, c, id, qemu, want)
			if hasPhase(phases, "spawn") {
				t.Errorf("a claimed VM's create restored too: %s", phaseList(phases))
			}
		}
		if _, err := c.Ctr("task", "kill", "--signal", "SIGKILL", id); err != nil {
			t.Fatal(err)
		}
		waitStatus(t, c, id, "STOPPED")
		if _, err := c.Ctr("task", "delete", id); err != nil {
			t.Fatal(err)
		}
		if claimed && processRuns(qemu) {
			t.Errorf("the claimed VM's hypervisor %d runs after its task's delete", qemu)
		}
		if _, err := c.Ctr("container", "rm", id); err != nil {
			t.Fatal(err)
		}
	}
	if !claimed {
		t.Fatal("no container claimed the pooled VM in 3 rounds")
	}
	dir, spare := awaitPooledVM(t, c)
	qemu := processUsing(dir, "qemu")
	before := cpuTime(qemu)
	time.Sleep(2 * time.Second)
	t.Logf("a waiting pooled VM: PSS %s, %d CPU ticks in 2 s; its spare: PSS %s", pss(qemu), cpuTime(qemu)-before, pss(spare))
	if err := syscall.Kill(spare, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the killed spare's VM gone", func() error {
		if processRuns(qemu) {
			return fmt.Errorf("qemu %d of %s runs", qemu, dir)
		}
		return nil
	})
	if out, err := runOrdinary(c, []string{"--rm"}, "after-kill", "cat", testimage.RandomFile); err != nil || strings.TrimSpace(out) != want {
		t.Fatalf("container after a killed spare: %q, %v", out, err)
	}
	// A pooled VM whose hypervisor died while it waited is not claimed:
	// the next container restores its own.
	dir2, _ := awaitPooledVM(t, c)
	// The new fill swept the lease of the killed spare's base snapshot.
	if out, err := c.Ctr("leases", "ls"); err != nil || strings.Contains(out, "cocoon-base-pool-"+strconv.Itoa(spare)) {
		t.Errorf("leases after the killed spare's were swept: %q, %v; want none of pool-%d", out, err, spare)
	}
	if err := syscall.Kill(processUsing(dir2, "qemu"), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if out, err := runOrdinary(c, []string{"--rm"}, "after-vm-kill", "cat", testimage.RandomFile); err != nil || strings.TrimSpace(out) != want {
		t.Fatalf("container after its pooled VM died: %q, %v", out, err)
	}
	testenv.Eventually(t, time.Minute, "the killed spare's run dir swept", func() error {
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%s: %v", dir, err)
		}
		return nil
	})
}

// TestPooledVMSnapshotImage: a snapshot image's task orders its own chain
// (its container's top layer, which containerd names): the next task of
// the image claims the VM restored from it and runs in its guest's root.
func TestPooledVMSnapshotImage(t *testing.T) {
	c := stack(t, "[shim]\npooled_vm = true")
	if out, err := run(c, []string{"--rm"}, "first", "echo", "first"); err != nil || strings.TrimSpace(out) != "first" {
		t.Fatalf("first container: %q, %v", out, err)
	}
	awaitPooledVM(t, c)
	if _, err := run(c, []string{"-d"}, "claim", "sleep", "600"); err != nil {
		t.Fatal(err)
	}
	phases := readReport(t, c, "claim").Phases
	t.Logf("claimed: %s", phaseList(phases))
	if !hasPhase(phases, vm.PhaseClaim) || hasPhase(phases, "spawn") {
		t.Errorf("phases %s: want the pooled VM claimed, no restore", phaseList(phases))
	}
	out, err := c.Ctr("task", "exec", "--exec-id", "e1", "--fifo-dir", c.FifoDir, "claim", "echo", "in-the-claimed-vm")
	if err != nil || strings.TrimSpace(out) != "in-the-claimed-vm" {
		t.Errorf("exec in the claimed VM: %q, %v", out, err)
	}
	if _, err := c.Ctr("task", "kill", "--signal", "SIGKILL", "claim"); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, c, "claim", "STOPPED")
	if _, err := c.Ctr("task", "delete", "claim"); err != nil {
		t.Fatal(err)
	}
}

// TestPooledVMBurst: with shim.spares = 3, a task's server tops up three
// spares, each with a pooled VM; three containers started at once claim
// one each (each a hypervisor of its own, none restored), and their three
// servers, refilling at once, put back three spares, not more.
func TestPooledVMBurst(t *testing.T) {
	c := stack(t, "[shim]\npooled_vm = true\nspares = 3")
	if out, err := run(c, []string{"--rm"}, "first", "echo", "first"); err != nil || strings.TrimSpace(out) != "first" {
		t.Fatalf("first container: %q, %v", out, err)
	}
	awaitPooledVMs(t, c, 3)
	ids := []string{"burst0", "burst1", "burst2"}
	errs := make(chan error, len(ids))
	for _, id := range ids {
		go func() {
			_, err := run(c, []string{"-d"}, id, "sleep", "600")
			errs <- err
		}()
	}
	for range ids {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	vmms := map[int]string{}
	for _, id := range ids {
		phases := readReport(t, c, id).Phases
		if !hasPhase(phases, vm.PhaseClaim) || hasPhase(phases, "spawn") {
			t.Errorf("%s's phases %s: want a pooled VM claimed, no restore", id, phaseList(phases))
		}
		pid, _ := taskPID(t, c, id)
		if other, ok := vmms[pid]; ok {
			t.Errorf("%s and %s both run in hypervisor %d", id, other, pid)
		}
		vmms[pid] = id
	}
	for _, id := range ids {
		if _, err := c.Ctr("task", "kill", "--signal", "SIGKILL", id); err != nil {
			t.Fatal(err)
		}
		waitStatus(t, c, id, "STOPPED")
		if _, err := c.Ctr("task", "delete", id); err != nil {
			t.Fatal(err)
		}
	}
	awaitPooledVMs(t, c, 3)
}

// checkClaimed checks task id, which claimed the pooled VM whose
// hypervisor is qemu: its process reads the task's image, and the
// hypervisor is in the task's cgroup, under the normal scheduling policy.
func checkClaimed(t *testing.T, c *ctrdtest.Containerd, id string, qemu int, want string) {
	t.Helper()
	out, err := c.Ctr("task", "exec", "--exec-id", "e1", "--fifo-dir", c.FifoDir, id, "cat", testimage.RandomFile)
	if err != nil || strings.TrimSpace(out) != want {
		t.Errorf("exec in the claimed VM: %q, %v; want the image's file", out, err)
	}
	if pid, _ := taskPID(t, c, id); pid != qemu {
		t.Errorf("task %s's pid %d, want the pooled VM's hypervisor %d", id, pid, qemu)
	}
	if cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", qemu)); !strings.Contains(string(cg), id) {
		t.Errorf("the claimed hypervisor's cgroup %q does not name the task %s", cg, id)
	}
	if policy := statField(qemu, 41); policy != "0" {
		t.Errorf("the claimed hypervisor's scheduling policy %s, want 0 (SCHED_NORMAL)", policy)
	}
}

// awaitPooledVM waits for a spare's pooled VM to be up and warm (its
// hypervisor under SCHED_IDLE, and idle), and returns its run dir and the
// spare's pid.
func awaitPooledVM(t *testing.T, c *ctrdtest.Containerd) (string, int) {
	t.Helper()
	dirs, spares := awaitPooledVMs(t, c, 1)
	return dirs[0], spares[0]
}

// awaitPooledVMs waits for n spares' pooled VMs to be up and warm, and
// returns their run dirs and the spares' pids.
func awaitPooledVMs(t *testing.T, c *ctrdtest.Containerd, n int) ([]string, []int) {
	t.Helper()
	var dirs []string
	var spares []int
	testenv.Eventually(t, 2*time.Minute, fmt.Sprintf("%d pooled VMs up and idle", n), func() error {
		dirs, _ = filepath.Glob(filepath.Join(c.RunDir, ctrdtest.Namespace, "pool-*"))
		if len(dirs) != n {
			return fmt.Errorf("pooled VM run dirs %v, want %d", dirs, n)
		}
		spares = spares[:0]
		for _, dir := range dirs {
			spare, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(dir), "pool-"))
			if err != nil {
				return err
			}
			if err := pooledIdle(dir); err != nil {
				return err
			}
			spares = append(spares, spare)
		}
		return nil
	})
	return dirs, spares
}

// pooledIdle says why the pooled VM in run dir dir is not waiting warm:
// its hypervisor is not under SCHED_IDLE, or busy.
func pooledIdle(dir string) error {
	qemu := processUsing(dir, "qemu")
	if qemu == 0 {
		return fmt.Errorf("no hypervisor in %s", dir)
	}
	if policy := statField(qemu, 41); policy != "5" {
		return fmt.Errorf("pooled hypervisor %d's scheduling policy %s, want 5 (SCHED_IDLE)", qemu, policy)
	}
	before := cpuTime(qemu)
	time.Sleep(500 * time.Millisecond)
	if after := cpuTime(qemu); after-before > 5 {
		return fmt.Errorf("hypervisor %d busy (%d ticks in 500 ms)", qemu, after-before)
	}
	return nil
}

// processUsing is the pid of a process whose executable's name holds name
// and whose command line names dir; 0 if none.
func processUsing(dir, name string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, _ := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if strings.Contains(filepath.Base(exe), name) && strings.Contains(string(cmdline), dir) {
			return pid
		}
	}
	return 0
}

// cpuTime is pid's user and system time in clock ticks.
func cpuTime(pid int) int {
	u, _ := strconv.Atoi(statField(pid, 14))
	s, _ := strconv.Atoi(statField(pid, 15))
	return u + s
}

// statField is field n (from 1, as proc(5) numbers them) of
// /proc/pid/stat; "" if there is none.
func statField(pid, n int) string {
	b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if n-3 < 0 || n-3 >= len(f) {
		return ""
	}
	return f[n-3]
}

// pss is the Pss line of pid's smaps_rollup.
func pss(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	for l := range strings.Lines(string(b)) {
		if strings.HasPrefix(l, "Pss:") {
			return strings.Join(strings.Fields(l)[1:], " ")
		}
	}
	return "?"
}

func hasPhase(phases []state.Phase, name string) bool {
	for _, p := range phases {
		if p.Name == name {
			return true
		}
	}
	return false
}
