package vm

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
)

// exitRecorder passes on the ids of TaskExit events.
type exitRecorder struct {
	exits chan string
}

func newExitRecorder() *exitRecorder { return &exitRecorder{exits: make(chan string, 16)} }

func (r *exitRecorder) Publish(_ context.Context, _ string, e events.Event) error {
	if x, ok := e.(*eventstypes.TaskExit); ok {
		r.exits <- x.ID
	}
	return nil
}

// TestServiceOverAgent runs the task service on this package's launcher,
// with the real agent server running the processes on the host: the whole
// shim but the hypervisor.
func TestServiceOverAgent(t *testing.T) {
	testenv.RequireRoot(t) // the agent sets the process's credentials
	base := t.TempDir()
	cfgPath, _ := writeConfig(t, false)
	l, _ := newLauncher(t)
	ctx := namespaces.WithNamespace(context.Background(), "test")
	ctx, sd := shutdown.WithShutdown(ctx)
	rec := newExitRecorder()
	svc := task.NewService(ctx, l, rec, sd)
	t.Cleanup(func() { sd.Shutdown(); <-sd.Done() })

	bundle := filepath.Join(base, "bundle")
	spec := &specs.Spec{Version: specs.Version, Process: &specs.Process{
		Args: []string{"sh", "-c", "echo hi from $HOSTNAME_CHECK; exit 7"}, Env: []string{"HOSTNAME_CHECK=guest", "PATH=/usr/bin:/bin"}, Cwd: "/",
	}}
	writeBundle(t, bundle, spec)
	opts, err := typeurl.MarshalAnyToProto(&runtimeoptions.Options{ConfigPath: cfgPath})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(base, "out.log")
	_, err = svc.Create(ctx, &taskAPI.CreateTaskRequest{
		ID: "t1", Bundle: bundle, Options: opts, Stdout: "file://" + out,
		Rootfs: []*types.Mount{{Type: "bind", Source: stageChain(t), Options: []string{"rbind"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Start(ctx, &taskAPI.StartRequest{ID: "t1"}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	w, err := svc.Wait(wctx, &taskAPI.WaitRequest{ID: "t1"})
	if err != nil {
		t.Fatal(err)
	}
	if w.ExitStatus != 7 {
		t.Fatalf("exit %d, want 7", w.ExitStatus)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "hi from guest\n" {
		t.Fatalf("stdout %q, want %q", got, "hi from guest\n")
	}
	if _, err := svc.Delete(ctx, &taskAPI.DeleteRequest{ID: "t1"}); err != nil {
		t.Fatal(err)
	}
	waitExit(t, rec, "t1")
	report, err := state.ReadReport(bundle)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, p := range report.Phases {
		names[p.Name] = true
	}
	for _, want := range []string{"spawn", "resume", "agent", "init", "process started"} {
		if !names[want] {
			t.Fatalf("report phases %+v lack %q", report.Phases, want)
		}
	}
}

func waitExit(t *testing.T, r *exitRecorder, id string) {
	t.Helper()
	select {
	case got := <-r.exits:
		if got != id {
			t.Fatalf("exit event for %q, want %q", got, id)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("no exit event for %s", id)
	}
}

func writeBundle(t *testing.T, dir string, spec *specs.Spec) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestExecPidOverAgent: an exec's Start returns the pid the agent ran it
// as (here on the host, so the process can print it), and the task keeps
// the hypervisor's.
func TestExecPidOverAgent(t *testing.T) {
	testenv.RequireRoot(t) // the agent sets the process's credentials
	base := t.TempDir()
	cfgPath, _ := writeConfig(t, false)
	l, _ := newLauncher(t)
	ctx := namespaces.WithNamespace(context.Background(), "test")
	ctx, sd := shutdown.WithShutdown(ctx)
	svc := task.NewService(ctx, l, newExitRecorder(), sd)
	t.Cleanup(func() { sd.Shutdown(); <-sd.Done() })

	bundle := filepath.Join(base, "bundle")
	writeBundle(t, bundle, &specs.Spec{Version: specs.Version, Process: &specs.Process{Args: []string{"sleep", "60"}, Cwd: "/"}})
	opts, err := typeurl.MarshalAnyToProto(&runtimeoptions.Options{ConfigPath: cfgPath})
	if err != nil {
		t.Fatal(err)
	}
	created, err := svc.Create(ctx, &taskAPI.CreateTaskRequest{
		ID: "t1", Bundle: bundle, Options: opts,
		Rootfs: []*types.Mount{{Type: "bind", Source: stageChain(t), Options: []string{"rbind"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Start(ctx, &taskAPI.StartRequest{ID: "t1"}); err != nil {
		t.Fatal(err)
	}
	proc, err := typeurl.MarshalAnyToProto(&specs.Process{Args: []string{"sh", "-c", "echo $$"}, Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(base, "exec.log")
	if _, err := svc.Exec(ctx, &taskAPI.ExecProcessRequest{ID: "t1", ExecID: "e1", Spec: proc, Stdout: "file://" + out}); err != nil {
		t.Fatal(err)
	}
	started, err := svc.Start(ctx, &taskAPI.StartRequest{ID: "t1", ExecID: "e1"})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := svc.Wait(wctx, &taskAPI.WaitRequest{ID: "t1", ExecID: "e1"}); err != nil {
		t.Fatal(err)
	}
	printed, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%d\n", started.Pid); started.Pid == created.Pid || string(printed) != want {
		t.Fatalf("exec Start pid %d (task pid %d), process printed %q: want its own pid", started.Pid, created.Pid, printed)
	}
	if _, err := svc.Kill(ctx, &taskAPI.KillRequest{ID: "t1", Signal: 9}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Wait(wctx, &taskAPI.WaitRequest{ID: "t1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Delete(ctx, &taskAPI.DeleteRequest{ID: "t1"}); err != nil {
		t.Fatal(err)
	}
}
