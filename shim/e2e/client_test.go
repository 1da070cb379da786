package e2e

import (
	"bytes"
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/ctrdtest"
)

// TestGoClient drives a task through the containerd Go client: create,
// start, exec, pids, metrics, pause/resume, kill, wait and delete.
func TestGoClient(t *testing.T) {
	c := stack(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl := c.Client()
	img, err := cl.GetImage(ctx, imageRef)
	if err != nil {
		t.Fatal(err)
	}
	container, err := cl.NewContainer(ctx, "g1",
		client.WithSnapshotter(ctrdtest.Snapshotter),
		client.WithNewSnapshot("g1", img),
		client.WithRuntime(runtimeName, nil),
		client.WithNewSpec(oci.WithImageConfig(img), oci.WithProcessArgs("sleep", "600")))
	if err != nil {
		t.Fatal(err)
	}
	defer container.Delete(context.WithoutCancel(ctx), client.WithSnapshotCleanup)
	task, err := container.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, &bytes.Buffer{}, &bytes.Buffer{}), cio.WithFIFODir(c.FifoDir)))
	if err != nil {
		t.Fatal(err)
	}
	exited, err := task.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := execOutput(ctx, t, c, task, "echo", "from-go-exec"); got != "from-go-exec\n" {
		t.Fatalf("exec output %q, want from-go-exec", got)
	}
	if pids, err := task.Pids(ctx); err != nil || len(pids) == 0 {
		t.Fatalf("Pids = %v, %v; want the guest's processes", pids, err)
	}
	if m, err := task.Metrics(ctx); err != nil || m.Data == nil {
		t.Fatalf("Metrics = %v, %v; want cgroup metrics", m, err)
	}
	for _, step := range []func(context.Context) error{task.Pause, task.Resume} {
		if err := step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := task.Kill(ctx, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	st := <-exited
	if code, _, err := st.Result(); err != nil || code != 128+uint32(syscall.SIGTERM) {
		t.Fatalf("exit %d, %v; want %d", code, err, 128+syscall.SIGTERM)
	}
	if _, err := task.Delete(ctx); err != nil {
		t.Fatal(err)
	}
}

func execOutput(ctx context.Context, t *testing.T, c *ctrdtest.Containerd, task client.Task, args ...string) string {
	t.Helper()
	spec, err := task.Spec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pspec := *spec.Process
	pspec.Args = args
	var stdout, stderr bytes.Buffer
	p, err := task.Exec(ctx, "x1", &pspec, cio.NewCreator(cio.WithStreams(nil, &stdout, &stderr), cio.WithFIFODir(c.FifoDir)))
	if err != nil {
		t.Fatal(err)
	}
	exited, err := p.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// The task's pid is the hypervisor's; an exec's is its own, in the guest.
	if p.Pid() == 0 || p.Pid() == task.Pid() {
		t.Fatalf("exec pid %d, want its guest pid (the task's is %d)", p.Pid(), task.Pid())
	}
	if code, _, err := (<-exited).Result(); err != nil || code != 0 {
		t.Fatalf("exec %v: exit %d, %v (stderr %q)", args, code, err, stderr.String())
	}
	if _, err := p.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	return stdout.String()
}
