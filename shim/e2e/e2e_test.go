// Package e2e drives the shim end to end: containerd v2.4.2, the cocoon
// snapshotter, containerd-shim-cocoon-v2 and QEMU running the project's
// guest, through ctr.
package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	eventsapi "github.com/containerd/containerd/api/events"
	"github.com/containerd/typeurl/v2"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/ctrdtest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testimage"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/spare"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
)

const (
	runtimeName = "io.containerd.cocoon.v2"
	imageRef    = "example.com/cocoon/e2e:1"
)

var (
	bakeOnce    sync.Once
	bakeDir     string
	bakeArchive string
	bakeErr     error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if bakeDir != "" {
		os.RemoveAll(bakeDir)
	}
	os.Exit(code)
}

// image bakes the test image once per test binary: the project's guest
// booted on QEMU, snapshotted and packed as an OCI archive.
func image(t testing.TB) string {
	t.Helper()
	testenv.QEMU(t)
	guest := testenv.Guest(t)
	cocoonctl := testenv.Bin(t, "cocoonctl")
	bakeOnce.Do(func() {
		if bakeDir, bakeErr = os.MkdirTemp("", "cocoon-e2e-"); bakeErr != nil {
			return
		}
		bakeArchive, bakeErr = testimage.Bake(cocoonctl, guest, imageRef, 256<<20, bakeDir, testimage.BakeOptions{})
	})
	if bakeErr != nil {
		t.Fatal(bakeErr)
	}
	return bakeArchive
}

// stack starts containerd with the cocoon snapshotter, the shim on PATH and
// the test image imported.
func stack(t testing.TB, cocoonConfig string) *ctrdtest.Containerd {
	t.Helper()
	archive := image(t)
	testenv.Bin(t, "containerd-shim-cocoon-v2")
	testenv.Bin(t, "cocoon-shim-server")
	c := ctrdtest.Start(t, ctrdtest.Options{SnapshotterConfig: cocoonConfig})
	if _, err := c.Ctr("images", "import", "--snapshotter", ctrdtest.Snapshotter, archive); err != nil {
		t.Fatal(err)
	}
	return c
}

// run is `ctr run` of the test image with the cocoon runtime and snapshotter.
func run(c *ctrdtest.Containerd, flags []string, id string, args ...string) (string, error) {
	argv := append([]string{"run", "--runtime", runtimeName, "--snapshotter", ctrdtest.Snapshotter, "--fifo-dir", c.FifoDir}, flags...)
	argv = append(argv, imageRef, id)
	return c.Ctr(append(argv, args...)...)
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

func TestRunEchoAndExitCodes(t *testing.T) {
	c := stack(t, "")
	out, err := run(c, []string{"--rm"}, "t1", "echo", "hi")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(out) != "hi" {
		t.Fatalf("ctr run echo hi printed %q, want hi", out)
	}
	_, err = run(c, []string{"--rm"}, "t2", "sh", "-c", "exit 7")
	if code := exitCode(err); code != 7 {
		t.Fatalf("ctr run sh -c 'exit 7': exit %d (%v), want 7", code, err)
	}
}

// TestTerminal runs `ctr run -t` on a pseudo-terminal: the guest process
// must see a terminal on stdin and its output must come back through it.
func TestTerminal(t *testing.T) {
	c := stack(t, "")
	argv := append(c.CtrArgs()[1:], "run", "-t", "--rm", "--runtime", runtimeName, "--snapshotter", ctrdtest.Snapshotter,
		"--fifo-dir", c.FifoDir, imageRef, "tty1", "sh", "-c", "[ -t 0 ] && echo guest-has-a-tty; exit 3")
	out, code := testenv.RunOnPty(t, exec.Command(c.CtrArgs()[0], argv...))
	if code != 3 {
		t.Fatalf("ctr run -t: exit %d, want 3 (terminal: %q)", code, out)
	}
	if !strings.Contains(out, "guest-has-a-tty") {
		t.Fatalf("terminal output %q lacks guest-has-a-tty", out)
	}
}

// taskPID is the task's pid (the hypervisor's) from `ctr task ls`, and its
// status.
func taskPID(t testing.TB, c *ctrdtest.Containerd, id string) (int, string) {
	t.Helper()
	out, err := c.Ctr("task", "ls")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == id {
			pid, _ := strconv.Atoi(f[1])
			return pid, f[2]
		}
	}
	t.Fatalf("task %s not listed:\n%s", id, out)
	return 0, ""
}

func TestTaskOperations(t *testing.T) {
	c := stack(t, "")
	// The default config does not allow the annotation: it is ignored, and
	// the report says why.
	if _, err := run(c, []string{"-d", "--annotation", "io.cocoon.restore-mode=copy"}, "t1", "sleep", "600"); err != nil {
		t.Fatal(err)
	}
	report := readReport(t, c, "t1")
	if report.Plan.Mode != "mmap" || !strings.Contains(strings.Join(report.Plan.Warnings, " "), "allow_annotation") {
		t.Fatalf("disallowed annotation: mode %s, warnings %v; want mmap and a warning naming allow_annotation",
			report.Plan.Mode, report.Plan.Warnings)
	}
	pid, status := taskPID(t, c, "t1")
	if status != "RUNNING" || !processRuns(pid) {
		t.Fatalf("task t1 is %s with pid %d (running %v), want a RUNNING hypervisor", status, pid, processRuns(pid))
	}
	out, err := c.Ctr("task", "exec", "--exec-id", "e1", "--fifo-dir", c.FifoDir, "t1", "echo", "from-exec")
	if err != nil || strings.TrimSpace(out) != "from-exec" {
		t.Fatalf("ctr task exec: %q, %v; want from-exec", out, err)
	}
	if out, err := c.Ctr("task", "ps", "t1"); err != nil || len(strings.Split(strings.TrimSpace(out), "\n")) < 2 {
		t.Fatalf("ctr task ps: %q, %v; want the guest's processes", out, err)
	}
	if out, err := c.Ctr("task", "metrics", "t1"); err != nil || !strings.Contains(out, "memory") {
		t.Fatalf("ctr task metrics: %q, %v; want cgroup metrics", out, err)
	}
	for _, step := range []struct{ cmd, want string }{{"pause", "PAUSED"}, {"resume", "RUNNING"}} {
		if _, err := c.Ctr("task", step.cmd, "t1"); err != nil {
			t.Fatal(err)
		}
		if _, st := taskPID(t, c, "t1"); st != step.want {
			t.Fatalf("after ctr task %s: %s, want %s", step.cmd, st, step.want)
		}
	}
	if _, err := c.Ctr("task", "kill", "--signal", "SIGKILL", "t1"); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, c, "t1", "STOPPED")
	if _, err := c.Ctr("task", "delete", "t1"); err != nil {
		t.Fatal(err)
	}
	if processRuns(pid) {
		t.Fatalf("hypervisor %d still runs after ctr task delete", pid)
	}
	if _, err := c.Ctr("container", "rm", "t1"); err != nil {
		t.Fatal(err)
	}
}

// TestCheckpoint checkpoints a running task (an mmap restore, the
// default) with ctr into a chain link; the task runs on.
func TestCheckpoint(t *testing.T) {
	c := stack(t, "")
	if _, err := run(c, []string{"-d"}, "t1", "sleep", "600"); err != nil {
		t.Fatal(err)
	}
	out, err := c.Ctr("task", "checkpoint", "t1")
	if err != nil {
		t.Fatalf("ctr task checkpoint: %v\n%s", err, out)
	}
	if images, err := c.Ctr("images", "ls", "-q"); err != nil || strings.TrimSpace(out) == "" || !strings.Contains(images, strings.TrimSpace(out)) {
		t.Fatalf("checkpoint image %q not listed in:\n%s (%v)", out, images, err)
	}
	if _, st := taskPID(t, c, "t1"); st != "RUNNING" {
		t.Fatalf("after ctr task checkpoint: %s, want RUNNING", st)
	}
	if out, err := c.Ctr("task", "exec", "--exec-id", "e1", "--fifo-dir", c.FifoDir, "t1", "echo", "still-here"); err != nil || strings.TrimSpace(out) != "still-here" {
		t.Fatalf("exec after checkpoint: %q, %v; want the guest still answering", out, err)
	}
}

func TestRestoreModeAnnotation(t *testing.T) {
	c := stack(t, "[restore]\nallow_annotation = true\n")
	for _, mode := range []string{"copy", "mmap"} {
		id := "m-" + mode
		if _, err := run(c, []string{"-d", "--annotation", "io.cocoon.restore-mode=" + mode}, id, "sleep", "600"); err != nil {
			t.Fatal(err)
		}
		report := readReport(t, c, id)
		if string(report.Plan.Mode) != mode {
			t.Fatalf("annotation %s restored in %s mode (reasons %v)", mode, report.Plan.Mode, report.Plan.Reasons)
		}
		t.Logf("%s restore: total %s, phases %s", mode, time.Duration(report.Total), phaseList(report.Phases))
	}
	_, err := run(c, []string{"--rm", "--annotation", "io.cocoon.restore-mode=fast"}, "bad", "true")
	if err == nil || !strings.Contains(err.Error(), `"fast"`) {
		t.Fatalf("unknown mode: %v, want an error naming it", err)
	}
}

// TestShimCrash SIGKILLs the shim of a running task: containerd must
// report the exit (its `shim delete` reads the task record), and the VM,
// its run dir and cgroup must be gone once the container is removed.
func TestShimCrash(t *testing.T) {
	c := stack(t, "")
	if _, err := run(c, []string{"-d"}, "t1", "sleep", "600"); err != nil {
		t.Fatal(err)
	}
	vmPID, _ := taskPID(t, c, "t1")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	exits, errs := c.Client().Subscribe(ctx, `topic=="/tasks/exit"`)
	if err := syscall.Kill(shimOf(t, c, "t1"), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case env := <-exits:
		ev, err := typeurl.UnmarshalAny(env.Event)
		if err != nil {
			t.Fatal(err)
		}
		if exit := ev.(*eventsapi.TaskExit); exit.ContainerID != "t1" {
			t.Fatalf("exit event for %s, want t1", exit.ContainerID)
		}
	case err := <-errs:
		t.Fatalf("event stream: %v", err)
	}
	if out, err := c.Ctr("task", "ls"); err != nil || strings.Contains(out, "RUNNING") {
		t.Fatalf("after the shim crash ctr task ls shows:\n%s (%v)", out, err)
	}
	if _, err := c.Ctr("container", "rm", "t1"); err != nil {
		t.Fatal(err)
	}
	if processRuns(vmPID) {
		t.Fatalf("hypervisor %d survived its shim's crash", vmPID)
	}
	runDir := filepath.Join(c.RunDir, ctrdtest.Namespace, "t1")
	if _, err := os.Stat(runDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the VM's run dir %s is left (stat: %v)", runDir, err)
	}
	// The harness's containerd config puts shim sockets in Dir/s, next to
	// the spare server's, which is containerd's.
	socks, _ := os.ReadDir(filepath.Join(c.Dir, "s"))
	for _, s := range socks {
		if !strings.HasPrefix(s.Name(), spare.SocketPrefix) {
			t.Fatalf("the crashed shim's socket %s is left", s.Name())
		}
	}
	for _, sub := range []string{"pids", "cpu", "memory"} {
		dir := filepath.Join("/sys/fs/cgroup", sub, ctrdtest.Namespace, "t1")
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("cgroup %s is left (stat: %v)", dir, err)
		}
	}
}

// readReport reads task id's restore report from its bundle.
func readReport(t testing.TB, c *ctrdtest.Containerd, id string) *state.Report {
	t.Helper()
	report, err := state.ReadReport(filepath.Join(c.State, "io.containerd.runtime.v2.task", ctrdtest.Namespace, id))
	if err != nil {
		t.Fatal(err)
	}
	return report
}

func phaseList(phases []state.Phase) string {
	parts := make([]string, 0, len(phases))
	for _, p := range phases {
		parts = append(parts, p.Name+"="+time.Duration(p.Duration).String())
	}
	return strings.Join(parts, " ")
}

// waitStatus waits until ctr task ls shows id in status, or the task is
// gone when status is "".
func waitStatus(t testing.TB, c *ctrdtest.Containerd, id, status string) {
	t.Helper()
	testenv.Eventually(t, time.Minute, fmt.Sprintf("task %s %q", id, status), func() error {
		if _, st := taskPID(t, c, id); st != status {
			return fmt.Errorf("task %s is %q", id, st)
		}
		return nil
	})
}

func processRuns(pid int) bool {
	if pid <= 0 {
		return false
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// A zombie has exited; only its parent has not collected it yet.
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}

// shimOf finds the shim serving task id: the cocoon-shim-server process
// running in the task's bundle under this containerd's state dir.
func shimOf(t *testing.T, c *ctrdtest.Containerd, id string) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		args := strings.Split(string(cmdline), "\x00")
		cwd, _ := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		if len(args) > 0 && filepath.Base(args[0]) == "cocoon-shim-server" &&
			strings.HasPrefix(cwd, c.State) && filepath.Base(cwd) == id {
			return pid
		}
	}
	t.Fatalf("no shim for task %s", id)
	return 0
}
