package task

import (
	"context"
	"errors"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/api/types/runc/options"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/launch"
)

func TestExitStatus(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want uint32
	}{
		{"exit 0", []string{"exit", "0"}, 0},
		{"exit 7", []string{"exit", "7"}, 7},
		{"exit 255", []string{"exit", "255"}, 255},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			h.create("t1", specFor(tt.args...), newFifos(t, false, false))
			h.start("t1", "")
			if got := h.wait("t1", ""); got != tt.want {
				t.Fatalf("exit %d, want %d", got, tt.want)
			}
			if resp := h.delete("t1", ""); resp.ExitStatus != tt.want {
				t.Fatalf("Delete exit %d, want %d", resp.ExitStatus, tt.want)
			}
		})
	}
}

func execSpec(t *testing.T, args ...string) *taskAPI.ExecProcessRequest {
	t.Helper()
	a, err := typeurl.MarshalAnyToProto(&specs.Process{Args: args, Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	return &taskAPI.ExecProcessRequest{ID: "t1", Spec: a}
}

// TestExecExitsBeforeInit kills init while an exec runs: the exec's exit
// must be published before init's.
func TestExecExitsBeforeInit(t *testing.T) {
	h := newHarness(t)
	h.create("t1", specFor("sleep"), newFifos(t, false, false))
	h.start("t1", "")
	req := execSpec(t, "sleep")
	req.ExecID = "e1"
	sio := newFifos(t, false, false)
	req.Stdout, req.Stderr = sio.stdout, sio.stderr
	if _, err := h.svc.Exec(h.ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := h.svc.Exec(h.ctx, req); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("second Exec e1: %v, want already exists", err)
	}
	h.start("t1", "e1")
	if st := h.status("t1", "e1"); st != tasktypes.Status_RUNNING {
		t.Fatalf("exec status %v, want RUNNING", st)
	}
	if _, err := h.svc.Kill(h.ctx, &taskAPI.KillRequest{ID: "t1", Signal: uint32(syscall.SIGTERM)}); err != nil {
		t.Fatal(err)
	}
	if got := h.wait("t1", ""); got != 128+uint32(syscall.SIGTERM) {
		t.Fatalf("init exit %d, want %d", got, 128+syscall.SIGTERM)
	}
	if got := h.wait("t1", "e1"); got != 128+uint32(syscall.SIGKILL) {
		t.Fatalf("exec exit %d, want %d (killed with its init)", got, 128+syscall.SIGKILL)
	}
	h.delete("t1", "e1")
	if _, err := h.guest.proc("exec-e1"); err == nil {
		t.Fatal("deleting exec e1 did not free it in the guest agent")
	}
	h.delete("t1", "")
	wantTopics(t, h.events.waitTopics(t, 7),
		"/tasks/create", "/tasks/start", "/tasks/exec-added", "/tasks/exec-started",
		"/tasks/exit:e1", "/tasks/exit:t1", "/tasks/delete")
	if _, err := h.svc.Exec(h.ctx, execSpec(t, "echo")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Exec after Delete: %v, want not found", err)
	}
}

func TestExecAfterInitExit(t *testing.T) {
	h := newHarness(t)
	h.create("t1", specFor("exit", "0"), newFifos(t, false, false))
	h.start("t1", "")
	h.wait("t1", "")
	req := execSpec(t, "echo")
	req.ExecID = "late"
	if _, err := h.svc.Exec(h.ctx, req); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Exec after init exit: %v, want failed precondition", err)
	}
}

func TestKill(t *testing.T) {
	tests := []struct {
		name       string
		start      bool
		pause      bool
		signalErr  error
		sig        syscall.Signal
		want       uint32
		wantVMDead bool
	}{
		{"created task", false, false, nil, syscall.SIGKILL, 137, false},
		{"running task SIGTERM", true, false, nil, syscall.SIGTERM, 143, false},
		{"paused VM gets SIGKILL", true, true, nil, syscall.SIGKILL, 137, true},
		{"unresponsive guest gets SIGKILL", true, false, errors.New("agent call timed out"), syscall.SIGKILL, 137, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			h.create("t1", specFor("sleep"), newFifos(t, false, false))
			if tt.start {
				h.start("t1", "")
			}
			if tt.pause {
				if _, err := h.svc.Pause(h.ctx, &taskAPI.PauseRequest{ID: "t1"}); err != nil {
					t.Fatal(err)
				}
			}
			h.guest.signalErr = tt.signalErr
			if _, err := h.svc.Kill(h.ctx, &taskAPI.KillRequest{ID: "t1", Signal: uint32(tt.sig)}); err != nil {
				t.Fatal(err)
			}
			if got := h.wait("t1", ""); got != tt.want {
				t.Fatalf("exit %d, want %d", got, tt.want)
			}
			if h.vm.exited() != tt.wantVMDead {
				t.Fatalf("VM exited %v, want %v", h.vm.exited(), tt.wantVMDead)
			}
			_, err := h.svc.Kill(h.ctx, &taskAPI.KillRequest{ID: "t1", Signal: uint32(tt.sig)})
			if !errors.Is(err, errdefs.ErrNotFound) {
				t.Fatalf("Kill of a finished process: %v, want not found", err)
			}
			h.delete("t1", "")
		})
	}
}

func TestKillAll(t *testing.T) {
	h := newHarness(t)
	h.create("t1", specFor("sleep"), newFifos(t, false, false))
	h.start("t1", "")
	for _, id := range []string{"a", "b"} {
		req := execSpec(t, "sleep")
		req.ExecID = id
		if _, err := h.svc.Exec(h.ctx, req); err != nil {
			t.Fatal(err)
		}
		h.start("t1", id)
	}
	if _, err := h.svc.Kill(h.ctx, &taskAPI.KillRequest{ID: "t1", Signal: uint32(syscall.SIGINT), All: true}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", ""} {
		if got := h.wait("t1", id); got != 128+uint32(syscall.SIGINT) {
			t.Fatalf("process %q exit %d, want %d", id, got, 128+syscall.SIGINT)
		}
	}
}

func TestPauseResume(t *testing.T) {
	h := newHarness(t)
	h.create("t1", specFor("sleep"), newFifos(t, false, false))
	if _, err := h.svc.Pause(h.ctx, &taskAPI.PauseRequest{ID: "t1"}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Pause of a created task: %v, want failed precondition", err)
	}
	h.start("t1", "")
	if _, err := h.svc.Pause(h.ctx, &taskAPI.PauseRequest{ID: "t1"}); err != nil {
		t.Fatal(err)
	}
	if st := h.status("t1", ""); st != tasktypes.Status_PAUSED || !h.vm.isPaused() {
		t.Fatalf("status %v, VM paused %v; want PAUSED", st, h.vm.isPaused())
	}
	if _, err := h.svc.Resume(h.ctx, &taskAPI.ResumeRequest{ID: "t1"}); err != nil {
		t.Fatal(err)
	}
	if st := h.status("t1", ""); st != tasktypes.Status_RUNNING || h.vm.isPaused() {
		t.Fatalf("status %v, VM paused %v; want RUNNING", st, h.vm.isPaused())
	}
	if _, err := h.svc.Resume(h.ctx, &taskAPI.ResumeRequest{ID: "t1"}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Resume of a running task: %v, want failed precondition", err)
	}
	wantTopics(t, h.events.waitTopics(t, 4), "/tasks/create", "/tasks/start", "/tasks/paused", "/tasks/resumed")
}

// TestStateDoesNotWaitForVM asks for State while a Pause is stuck in the
// VMM: State must answer from memory.
func TestStateDoesNotWaitForVM(t *testing.T) {
	h := newHarness(t)
	h.create("t1", specFor("sleep"), newFifos(t, false, false))
	h.start("t1", "")
	gate := make(chan struct{})
	h.vm.mu.Lock()
	h.vm.pauseGate, h.vm.pauseEntered = gate, make(chan struct{}, 1)
	h.vm.mu.Unlock()
	paused := make(chan error, 1)
	go func() {
		_, err := h.svc.Pause(h.ctx, &taskAPI.PauseRequest{ID: "t1"})
		paused <- err
	}()
	<-h.vm.pauseEntered
	ctx, cancel := context.WithTimeout(h.ctx, 10*time.Second)
	defer cancel()
	state := make(chan tasktypes.Status, 1)
	go func() { state <- h.status("t1", "") }()
	select {
	case st := <-state:
		if st != tasktypes.Status_RUNNING {
			t.Fatalf("status while pausing %v, want RUNNING", st)
		}
	case <-ctx.Done():
		t.Fatal("State blocked behind a Pause stuck in the VMM")
	}
	close(gate)
	if err := <-paused; err != nil {
		t.Fatal(err)
	}
}

func TestStdinAndCloseIO(t *testing.T) {
	h := newHarness(t)
	sio := newFifos(t, true, false)
	h.create("t1", specFor("cat"), sio)
	h.start("t1", "")
	if _, err := sio.in.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	sio.waitStdout(t, "ping\n")
	if _, err := h.svc.CloseIO(h.ctx, &taskAPI.CloseIORequest{ID: "t1", Stdin: true}); err != nil {
		t.Fatal(err)
	}
	if got := h.wait("t1", ""); got != 0 {
		t.Fatalf("cat exit %d after stdin closed, want 0", got)
	}
	if got := sio.output(t); got != "ping\n" {
		t.Fatalf("stdout %q, want %q", got, "ping\n")
	}
}

func TestTerminal(t *testing.T) {
	h := newHarness(t)
	sio := newFifos(t, true, true)
	h.create("t1", specFor("cat"), sio)
	h.start("t1", "")
	if _, err := h.svc.ResizePty(h.ctx, &taskAPI.ResizePtyRequest{ID: "t1", Width: 120, Height: 40}); err != nil {
		t.Fatal(err)
	}
	p, err := h.guest.proc(InitGuestID)
	if err != nil {
		t.Fatal(err)
	}
	<-p.resizeObserved
	if !p.spec.Terminal || p.width != 120 || p.height != 40 {
		t.Fatalf("guest terminal %v size %dx%d, want a 120x40 terminal", p.spec.Terminal, p.width, p.height)
	}
	if _, err := sio.in.Write([]byte("tty\n")); err != nil {
		t.Fatal(err)
	}
	sio.waitStdout(t, "tty\n")
}

func TestResizeWithoutTerminal(t *testing.T) {
	h := newHarness(t)
	h.create("t1", specFor("sleep"), newFifos(t, false, false))
	h.start("t1", "")
	_, err := h.svc.ResizePty(h.ctx, &taskAPI.ResizePtyRequest{ID: "t1", Width: 1, Height: 1})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("ResizePty without a terminal: %v, want failed precondition", err)
	}
}

func TestDeleteRunning(t *testing.T) {
	h := newHarness(t)
	h.create("t1", specFor("sleep"), newFifos(t, false, false))
	h.start("t1", "")
	_, err := h.svc.Delete(h.ctx, &taskAPI.DeleteRequest{ID: "t1"})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Delete of a running task: %v, want failed precondition", err)
	}
}

func TestDeleteCreated(t *testing.T) {
	h := newHarness(t)
	h.create("t1", specFor("sleep"), nil)
	if resp := h.delete("t1", ""); resp.ExitStatus != 137 {
		t.Fatalf("Delete of a created task: exit %d, want 137", resp.ExitStatus)
	}
	wantTopics(t, h.events.waitTopics(t, 3), "/tasks/create", "/tasks/exit:t1", "/tasks/delete")
	if !h.vm.exited() {
		t.Fatal("Delete left the VM running")
	}
}

// TestDeleteUncleanKeepsCleanup: a delete that could not release
// everything leaves no record of a clean one, so `shim delete` still runs
// the server's cleanup.
func TestDeleteUncleanKeepsCleanup(t *testing.T) {
	h := newHarness(t)
	h.vm.closeErr = errors.New("run dir busy")
	bundle := h.create("t1", specFor("sleep"), nil)
	h.delete("t1", "")
	if _, err := launch.ReadDeleted(bundle); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("deleted record after an unclean delete: %v, want none", err)
	}
}

func TestVMDies(t *testing.T) {
	h := newHarness(t)
	h.create("t1", specFor("sleep"), newFifos(t, false, false))
	h.start("t1", "")
	if err := h.vm.Kill(); err != nil {
		t.Fatal(err)
	}
	if got := h.wait("t1", ""); got != 137 {
		t.Fatalf("exit after the VM died %d, want 137", got)
	}
}

func TestCreateErrors(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(h *harness, r *taskAPI.CreateTaskRequest)
		want   error
	}{
		{"overlay rootfs", func(h *harness, r *taskAPI.CreateTaskRequest) {
			r.Rootfs = []*types.Mount{{Type: "overlay", Source: "overlay"}}
		}, errdefs.ErrInvalidArgument},
		{"from checkpoint", func(h *harness, r *taskAPI.CreateTaskRequest) { r.Checkpoint = "/tmp/cp" }, errdefs.ErrInvalidArgument},
		{"launcher fails", func(h *harness, r *taskAPI.CreateTaskRequest) {
			h.launcher.err = errors.New("unknown restore mode \"fast\"")
		}, errdefs.ErrUnknown},
		{"no process", func(h *harness, r *taskAPI.CreateTaskRequest) {
			r.Bundle = h.bundle(&specs.Spec{Version: specs.Version})
		}, errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			r := &taskAPI.CreateTaskRequest{ID: "t1", Bundle: h.bundle(specFor("echo")), Rootfs: h.rootfs()}
			tt.mutate(h, r)
			_, err := h.svc.Create(h.ctx, r)
			wantCode(t, err, tt.want)
		})
	}
	h := newHarness(t)
	h.create("t1", specFor("echo"), nil)
	_, err := h.svc.Create(h.ctx, &taskAPI.CreateTaskRequest{ID: "t1", Bundle: h.bundle(specFor("echo")), Rootfs: h.rootfs()})
	wantCode(t, err, errdefs.ErrAlreadyExists)
}

func TestConcurrentCreate(t *testing.T) {
	h := newHarness(t)
	h.launcher.started, h.launcher.gate = make(chan struct{}, 1), make(chan struct{})
	req := &taskAPI.CreateTaskRequest{ID: "t1", Bundle: h.bundle(specFor("echo")), Rootfs: h.rootfs()}
	first := make(chan error, 1)
	go func() {
		_, err := h.svc.Create(h.ctx, req)
		first <- err
	}()
	<-h.launcher.started
	_, err := h.svc.Create(h.ctx, req)
	wantCode(t, err, errdefs.ErrAlreadyExists)
	if _, err := h.svc.Shutdown(h.ctx, &taskAPI.ShutdownRequest{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.svc.sd.Done():
		t.Fatal("Shutdown stopped the shim during a Create")
	default:
	}
	close(h.launcher.gate)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
}

func TestCheckpoint(t *testing.T) {
	for _, tt := range []struct {
		name                 string
		noDiff, live, paused bool
		want                 string
	}{
		{"diff", false, false, false, "diff"},
		{"full where no diff is possible", true, false, false, "full"},
		{"live", false, true, false, "live-diff"},
		{"paused stays paused", false, true, true, "diff"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			h.vm.noDiff = tt.noDiff
			if tt.live {
				h.launcher.vm = liveVM{h.vm}
			}
			h.create("t1", specFor("sleep"), newFifos(t, false, false))
			h.start("t1", "")
			topics := []string{"/tasks/create", "/tasks/start", "/tasks/checkpointed"}
			if tt.paused {
				if _, err := h.svc.Pause(h.ctx, &taskAPI.PauseRequest{ID: "t1"}); err != nil {
					t.Fatal(err)
				}
				topics = slices.Insert(topics, 2, "/tasks/paused")
			}
			dir := t.TempDir()
			if _, err := h.svc.Checkpoint(h.ctx, &taskAPI.CheckpointTaskRequest{ID: "t1", Path: dir}); err != nil {
				t.Fatal(err)
			}
			if want := []string{tt.want + ":" + dir}; !slices.Equal(h.vm.snapshots, want) || h.vm.isPaused() != tt.paused {
				t.Fatalf("snapshots %v, VM paused %v; want %v and paused %v as before", h.vm.snapshots, h.vm.isPaused(), want, tt.paused)
			}
			wantTopics(t, h.events.waitTopics(t, len(topics)), topics...)
		})
	}

	plain := newHarness(t)
	plain.launcher.vm = plainVM{plain.vm}
	plain.create("t1", specFor("sleep"), newFifos(t, false, false))
	plain.start("t1", "")
	_, err := plain.svc.Checkpoint(plain.ctx, &taskAPI.CheckpointTaskRequest{ID: "t1", Path: t.TempDir()})
	wantCode(t, err, errdefs.ErrNotImplemented)
}

// A checkpoint that ends the task snapshots a paused VM, even where the
// driver could snapshot it live: nothing may run after the snapshot.
func TestCheckpointExitPausesFirst(t *testing.T) {
	h := newHarness(t)
	h.launcher.vm = liveVM{h.vm}
	h.create("t1", specFor("sleep"), newFifos(t, false, false))
	h.start("t1", "")
	opts, err := typeurl.MarshalAnyToProto(&options.CheckpointOptions{Exit: true})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := h.svc.Checkpoint(h.ctx, &taskAPI.CheckpointTaskRequest{ID: "t1", Path: dir, Options: opts}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"diff:" + dir}; !slices.Equal(h.vm.snapshots, want) {
		t.Fatalf("snapshots %v, want %v (paused, not live)", h.vm.snapshots, want)
	}
	select {
	case <-h.vm.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the VM still runs after a checkpoint with exit")
	}
}

func TestPids(t *testing.T) {
	h := newHarness(t)
	h.create("t1", specFor("sleep"), newFifos(t, false, false))
	h.start("t1", "")
	req := execSpec(t, "sleep")
	req.ExecID = "e1"
	if _, err := h.svc.Exec(h.ctx, req); err != nil {
		t.Fatal(err)
	}
	h.start("t1", "e1")
	resp, err := h.svc.Pids(h.ctx, &taskAPI.PidsRequest{ID: "t1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Processes) != 3 {
		t.Fatalf("%d processes, want guest init, the task's process and the exec", len(resp.Processes))
	}
	named := 0
	for _, p := range resp.Processes {
		if p.Info != nil {
			named++
		}
	}
	if named != 1 {
		t.Fatalf("%d processes carry exec details, want 1", named)
	}
}

func TestShutdownWithTasks(t *testing.T) {
	h := newHarness(t)
	h.create("t1", specFor("sleep"), nil)
	if _, err := h.svc.Shutdown(h.ctx, &taskAPI.ShutdownRequest{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.svc.sd.Done():
		t.Fatal("Shutdown stopped a shim that still serves a task")
	default:
	}
	h.delete("t1", "")
	if _, err := h.svc.Shutdown(h.ctx, &taskAPI.ShutdownRequest{}); err != nil {
		t.Fatal(err)
	}
	<-h.svc.sd.Done()
}

// waitStdout waits until the shim has written want to stdout.
func (s *stdioFifos) waitStdout(t *testing.T, want string) {
	t.Helper()
	timeout := time.After(testWait)
	for {
		s.mu.Lock()
		got, changed := s.out.String(), s.changed.next()
		s.mu.Unlock()
		if got == want {
			return
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("stdout %q, want %q", got, want)
		}
	}
}
