package task

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/fifo"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/rpcerr"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/launch"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
)

type harness struct {
	t        *testing.T
	ctx      context.Context
	svc      *Service
	vm       *fakeVM
	guest    *fakeGuest
	launcher *fakeLauncher
	events   *recorder
	staged   string
	base     string
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	// Bundles live under base, made before the shutdown cleanup is
	// registered, so they outlast the shim's last writes to them.
	base := t.TempDir()
	ctx := namespaces.WithNamespace(context.Background(), "test")
	ctx, sd := shutdown.WithShutdown(ctx)
	h := &harness{t: t, ctx: ctx, base: base, vm: newFakeVM(t), guest: newFakeGuest(), events: &recorder{}, staged: t.TempDir()}
	t.Cleanup(func() {
		sd.Shutdown() // kills every VM still held, and waits for their exits
		<-sd.Done()
	})
	h.launcher = &fakeLauncher{vm: h.vm, guest: h.guest}
	h.svc = NewService(ctx, h.launcher, h.events, sd)
	return h
}

// bundle writes a bundle whose process runs args.
func (h *harness) bundle(spec *specs.Spec) string {
	h.t.Helper()
	dir, err := os.MkdirTemp(h.base, "bundle-")
	if err != nil {
		h.t.Fatal(err)
	}
	data, err := json.Marshal(spec)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o600); err != nil {
		h.t.Fatal(err)
	}
	return dir
}

func specFor(args ...string) *specs.Spec {
	return &specs.Spec{Version: specs.Version, Process: &specs.Process{Args: args, Env: []string{"PATH=/bin"}, Cwd: "/"}}
}

func (h *harness) rootfs() []*types.Mount {
	return []*types.Mount{{Type: "bind", Source: h.staged, Options: []string{"rbind", "ro"}}}
}

func (h *harness) create(id string, spec *specs.Spec, sio *stdioFifos) string {
	h.t.Helper()
	bundle := h.bundle(spec)
	req := &taskAPI.CreateTaskRequest{ID: id, Bundle: bundle, Rootfs: h.rootfs()}
	if sio != nil {
		req.Stdin, req.Stdout, req.Stderr, req.Terminal = sio.stdin, sio.stdout, sio.stderr, sio.terminal
	}
	resp, err := h.svc.Create(h.ctx, req)
	if err != nil {
		h.t.Fatalf("Create: %v", err)
	}
	if int(resp.Pid) != h.vm.PID() {
		h.t.Fatalf("Create pid %d, want the hypervisor's %d", resp.Pid, h.vm.PID())
	}
	return bundle
}

func (h *harness) start(id, execID string) {
	h.t.Helper()
	if _, err := h.svc.Start(h.ctx, &taskAPI.StartRequest{ID: id, ExecID: execID}); err != nil {
		h.t.Fatalf("Start(%q): %v", execID, err)
	}
}

func (h *harness) wait(id, execID string) uint32 {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(h.ctx, 20*time.Second)
	defer cancel()
	resp, err := h.svc.Wait(ctx, &taskAPI.WaitRequest{ID: id, ExecID: execID})
	if err != nil {
		h.t.Fatalf("Wait(%q): %v", execID, err)
	}
	return resp.ExitStatus
}

func (h *harness) status(id, execID string) tasktypes.Status {
	h.t.Helper()
	resp, err := h.svc.State(h.ctx, &taskAPI.StateRequest{ID: id, ExecID: execID})
	if err != nil {
		h.t.Fatalf("State(%q): %v", execID, err)
	}
	return resp.Status
}

func (h *harness) delete(id, execID string) *taskAPI.DeleteResponse {
	h.t.Helper()
	resp, err := h.svc.Delete(h.ctx, &taskAPI.DeleteRequest{ID: id, ExecID: execID})
	if err != nil {
		h.t.Fatalf("Delete(%q): %v", execID, err)
	}
	return resp
}

// stdioFifos are containerd-style FIFOs with a reader collecting output.
type stdioFifos struct {
	stdin, stdout, stderr string
	terminal              bool
	in                    io.WriteCloser
	mu                    sync.Mutex
	out                   bytes.Buffer
	changed               changes // on every read of stdout
	outDone               chan struct{}
}

func newFifos(t *testing.T, withStdin, terminal bool) *stdioFifos {
	t.Helper()
	dir := t.TempDir()
	ctx := context.Background()
	s := &stdioFifos{stdout: filepath.Join(dir, "stdout"), terminal: terminal, outDone: make(chan struct{})}
	if !terminal {
		s.stderr = filepath.Join(dir, "stderr")
	}
	r, err := fifo.OpenFifo(ctx, s.stdout, syscall.O_RDONLY|syscall.O_CREAT|syscall.O_NONBLOCK, 0o700)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	go func() {
		defer close(s.outDone)
		buf := make([]byte, 4096)
		for {
			n, err := r.Read(buf)
			s.mu.Lock()
			s.out.Write(buf[:n])
			s.changed.notify()
			s.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	if s.stderr != "" {
		er, err := fifo.OpenFifo(ctx, s.stderr, syscall.O_RDONLY|syscall.O_CREAT|syscall.O_NONBLOCK, 0o700)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { er.Close() })
		go func() { _, _ = io.Copy(io.Discard, er) }()
	}
	if withStdin {
		s.stdin = filepath.Join(dir, "stdin")
		w, err := fifo.OpenFifo(ctx, s.stdin, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_NONBLOCK, 0o700)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Close() })
		s.in = w
	}
	return s
}

// output waits for the shim to close stdout and returns what it wrote.
func (s *stdioFifos) output(t *testing.T) string {
	t.Helper()
	select {
	case <-s.outDone:
	case <-time.After(20 * time.Second):
		t.Fatal("stdout never closed")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.String()
}

func wantTopics(t *testing.T, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("events\n got %v\nwant %v", got, want)
	}
}

func wantCode(t *testing.T, err error, want error) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %v", want)
	}
	// The service returns native errors; rpcerr's interceptor makes them
	// statuses on the wire, and a client reads them back.
	got := errgrpc.ToNative(rpcerr.ToGRPC(err))
	if !errors.Is(got, want) || (want != errdefs.ErrUnknown && !errors.Is(err, want)) {
		t.Fatalf("error %v (on the wire %v), want %v", err, got, want)
	}
}

func TestRunEcho(t *testing.T) {
	h := newHarness(t)
	sio := newFifos(t, false, false)
	bundle := h.create("t1", specFor("echo", "hi"), sio)
	if st := h.status("t1", ""); st != tasktypes.Status_CREATED {
		t.Fatalf("after Create status %v, want CREATED", st)
	}
	h.start("t1", "")
	if code := h.wait("t1", ""); code != 0 {
		t.Fatalf("exit %d, want 0", code)
	}
	if got := sio.output(t); got != "hi\n" {
		t.Fatalf("stdout %q, want %q", got, "hi\n")
	}
	if st := h.status("t1", ""); st != tasktypes.Status_STOPPED {
		t.Fatalf("after exit status %v, want STOPPED", st)
	}
	h.delete("t1", "")
	wantTopics(t, h.events.waitTopics(t, 4), "/tasks/create", "/tasks/start", "/tasks/exit:t1", "/tasks/delete")
	if !h.vm.exited() || !h.vm.closed || !h.guest.closed {
		t.Fatalf("Delete left the VM (exited %v closed %v) or agent (closed %v)", h.vm.exited(), h.vm.closed, h.guest.closed)
	}
	rec, err := state.ReadTask(bundle)
	if err != nil {
		t.Fatal(err)
	}
	if rec.PID != h.vm.PID() || rec.Exit == nil || rec.Exit.Status != 0 || rec.StagedDir != h.staged {
		t.Fatalf("task record %+v does not describe the run", rec)
	}
	deleted, err := launch.ReadDeleted(bundle)
	if err != nil {
		t.Fatalf("no record of the clean delete for the launcher's `delete`: %v", err)
	}
	if want := (launch.Deleted{Pid: uint32(rec.PID), ExitedAt: rec.Exit.At}); !deleted.ExitedAt.Equal(want.ExitedAt) || deleted.Pid != want.Pid || deleted.Status != 0 {
		t.Fatalf("deleted record %+v, want %+v", deleted, want)
	}
	report, err := state.ReadReport(bundle)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{}
	for _, p := range report.Phases {
		names = append(names, p.Name)
	}
	if want := []string{PhaseBundle, "spawn", PhaseRecord, startedPhase}; report.Plan.Mode != "mmap" || !slices.Equal(names, want) {
		t.Fatalf("report plan %q phases %v, want mmap with %v", report.Plan.Mode, names, want)
	}
	if _, err := h.svc.State(h.ctx, &taskAPI.StateRequest{ID: "t1"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("State after Delete: %v, want not found", err)
	}
}

func TestLaunchRequest(t *testing.T) {
	opts, err := typeurl.MarshalAnyToProto(&runtimeoptions.Options{ConfigPath: "/etc/cocoon/fast.toml"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		hostname   string
		options    *anypb.Any
		wantHost   string
		wantConfig string
	}{
		{"defaults", "", nil, "t1", ""},
		{"spec hostname and runtime options", "web", opts, "web", "/etc/cocoon/fast.toml"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			spec := specFor("echo")
			spec.Hostname = tt.hostname
			req := &taskAPI.CreateTaskRequest{ID: "t1", Bundle: h.bundle(spec), Rootfs: h.rootfs(), Options: tt.options}
			if _, err := h.svc.Create(h.ctx, req); err != nil {
				t.Fatal(err)
			}
			got := h.launcher.got[0]
			if got.StagedDir != h.staged || got.Hostname != tt.wantHost || got.ConfigPath != tt.wantConfig || got.Namespace != "test" {
				t.Fatalf("launch request %+v: want staged %s, hostname %s, config %q, namespace test", got, h.staged, tt.wantHost, tt.wantConfig)
			}
			if p := got.Process; p == nil || p.ID != InitGuestID || !slices.Equal(p.Args, spec.Process.Args) {
				t.Fatalf("launch request process %+v, want the init process %v to prepare", p, spec.Process.Args)
			}
		})
	}
}

// slowPublisher publishes after a pause, as a publisher to a busy
// containerd does.
type slowPublisher struct{ recorder }

func (p *slowPublisher) Publish(ctx context.Context, topic string, e events.Event) error {
	time.Sleep(50 * time.Millisecond)
	return p.recorder.Publish(ctx, topic, e)
}

// TestShutdownPublishesQueued: the events queued before the shim shuts
// down (the last task's delete) are published before shutdown is done,
// after which the shim's process ends.
func TestShutdownPublishesQueued(t *testing.T) {
	ctx, sd := shutdown.WithShutdown(namespaces.WithNamespace(context.Background(), "test"))
	pub := &slowPublisher{}
	s := NewService(ctx, &fakeLauncher{vm: newFakeVM(t), guest: newFakeGuest()}, pub, sd)
	for i := range 3 {
		s.send(&eventstypes.TaskDelete{ContainerID: fmt.Sprint("t", i)})
	}
	sd.Shutdown()
	<-sd.Done()
	if got := len(pub.all()); got != 3 {
		t.Fatalf("%d of 3 queued events published before shutdown was done", got)
	}
}

// settlingLauncher is a launcher whose own work settles when released.
type settlingLauncher struct {
	*fakeLauncher
	release chan struct{}
}

func (l settlingLauncher) Settle(ctx context.Context) {
	select {
	case <-l.release:
	case <-ctx.Done():
	}
}

// TestShutdownSettlesLauncher: the shim's shutdown is not done (its
// process would end) while the launcher's own work is under way.
func TestShutdownSettlesLauncher(t *testing.T) {
	ctx, sd := shutdown.WithShutdown(namespaces.WithNamespace(context.Background(), "test"))
	l := settlingLauncher{fakeLauncher: &fakeLauncher{vm: newFakeVM(t), guest: newFakeGuest()}, release: make(chan struct{})}
	NewService(ctx, l, &recorder{}, sd)
	sd.Shutdown()
	select {
	case <-sd.Done():
		t.Fatal("shutdown done with the launcher's work under way")
	case <-time.After(50 * time.Millisecond):
	}
	close(l.release)
	<-sd.Done()
}
