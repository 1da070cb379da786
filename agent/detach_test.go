package agent_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// A clone's Init detaches the processes it inherited from its snapshot: the
// clone's shim can start its own "init", and the old one runs on, its
// output drained so that it never blocks on a pipe nobody reads. The
// snapshot caught the old host in a read of that output, which its session
// ending cancelled.
func TestInitDetachesProcesses(t *testing.T) {
	testenv.RequireRoot(t) // the agent sets the process's credentials
	h := newHarness(t)
	old := h.client(t)
	ctx := ctxT(t)
	dir := t.TempDir()
	start, done := filepath.Join(dir, "start"), filepath.Join(dir, "done")
	// Silent until the test says, then 1 MiB of output, far more than a
	// pipe holds, then a file.
	script := "until [ -e " + start + " ]; do sleep 0.05; done; head -c 1048576 /dev/zero; touch " + done + "; sleep 600"
	p, err := old.Exec(ctx, agent.ExecRequest{ID: "init", Args: []string{"/bin/sh", "-c", script}, Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-int(p.Pid), syscall.SIGKILL) })
	_, stdout, _ := p.Stdio()
	read := make(chan struct{})
	go func() { defer close(read); _, _ = stdout.Read(make([]byte, 1)) }()
	testenv.Eventually(t, 10*time.Second, "the old host's read reaches the agent", agentReadingOutput)
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	<-read

	c := h.client(t)
	if _, err := c.Init(ctx, agent.InitRequest{Hostname: "clone"}); err != nil {
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
	if err := os.WriteFile(start, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "the detached process gets past its output", func() error {
		_, err := os.Stat(done)
		return err
	})
	if err := syscall.Kill(int(p.Pid), 0); err != nil {
		t.Errorf("the detached process %d is gone: %v", p.Pid, err)
	}
}

// agentReadingOutput tells whether the in-process agent is in a read of a
// process's output: a host's ReadOutput that has reached it.
func agentReadingOutput() error {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	if !bytes.Contains(buf, []byte("procio.(*Output).Read(")) {
		return errors.New("no goroutine in procio.(*Output).Read")
	}
	return nil
}
