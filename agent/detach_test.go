package agent_test

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// A clone's Init detaches the processes it inherited from its snapshot: the
// clone's shim can start its own "init", and the old one runs on, its
// output drained so that it never blocks on a pipe nobody reads.
func TestInitDetachesProcesses(t *testing.T) {
	testenv.RequireRoot(t) // the agent sets the process's credentials
	h := newHarness(t)
	c := h.client(t)
	ctx := ctxT(t)
	done := filepath.Join(t.TempDir(), "done")
	// 1 MiB of output, far more than a pipe holds, then a file.
	script := "head -c 1048576 /dev/zero; touch " + done + "; sleep 600"
	p, err := c.Exec(ctx, agent.ExecRequest{ID: "init", Args: []string{"/bin/sh", "-c", script}, Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-int(p.Pid), syscall.SIGKILL) })
	if err := c.Init(ctx, agent.InitRequest{Hostname: "clone"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx, "init"); !errdefs.IsNotFound(err) {
		t.Fatalf("wait for the detached init: %v, want not found", err)
	}
	again, err := c.Exec(ctx, agent.ExecRequest{ID: "init", Args: []string{"/bin/true"}, Cwd: "/"})
	if err != nil {
		t.Fatalf("exec a new init after Init: %v", err)
	}
	if st, err := c.Wait(ctx, "init"); err != nil || st.Code != 0 {
		t.Fatalf("new init %d: %+v, %v", again.Pid, st, err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(done); err == nil {
			break
		} else if !errors.Is(err, os.ErrNotExist) || time.Now().After(deadline) {
			t.Fatalf("the detached process never got past its output: %v", err)
		}
	}
	if err := syscall.Kill(int(p.Pid), 0); err != nil {
		t.Errorf("the detached process %d is gone: %v", p.Pid, err)
	}
}
