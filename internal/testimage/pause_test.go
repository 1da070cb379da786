package testimage

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// TestPause runs pause as PID 1 of a new PID namespace, as a pod's pause
// container with a shared PID namespace is: it reaps the processes
// orphaned to it and exits 0 on SIGTERM or SIGINT.
func TestPause(t *testing.T) {
	testenv.RequireRoot(t)
	nsenter := testenv.LookPath(t, "nsenter")
	testenv.LookPath(t, DefaultBusybox)
	bin, err := BuildPause(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			pause := exec.Command(bin)
			pause.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
			if err := pause.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- pause.Wait() }()
			// After Wait, Kill does nothing: it never signals a recycled pid.
			t.Cleanup(func() { _ = pause.Process.Kill() })
			waitReaping(t, nsenter, pause.Process.Pid)
			if err := pause.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			if err := <-exited; err != nil {
				t.Fatalf("pause after %v: %v, want exit 0", sig, err)
			}
		})
	}
}

// waitReaping orphans short-lived processes into pause's PID namespace
// until pause has collected every one: its signal handling is then in
// place (an exit signalled before it was is collected with a later one).
// A pause that never reaps fails here.
func waitReaping(t *testing.T, nsenter string, pid int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		// sh backgrounds a sleep and exits: the sleep is re-parented to pause.
		orphan := exec.Command(nsenter, "--target", strconv.Itoa(pid), "--pid", "--",
			DefaultBusybox, "sh", "-c", DefaultBusybox+" sleep 0.05 >/dev/null 2>&1 & exit 0")
		if out, err := orphan.CombinedOutput(); err != nil {
			t.Fatalf("orphan a process under pause: %v: %s", err, out)
		}
		for wait := time.Now().Add(time.Second); time.Now().Before(wait); time.Sleep(20 * time.Millisecond) {
			if children(t, pid) == "" {
				return
			}
		}
	}
	t.Fatalf("pause left its exited children %s unreaped", children(t, pid))
}

// children lists pid's children, zombies included, across its threads.
func children(t *testing.T, pid int) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "children"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no /proc/%d/task/*/children: %v", pid, err)
	}
	var all []string
	for _, f := range files {
		b, _ := os.ReadFile(f)
		all = append(all, strings.Fields(string(b))...)
	}
	return strings.Join(all, " ")
}
