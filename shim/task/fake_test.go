package task

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/containerd/v2/core/runtime"
	"github.com/containerd/errdefs"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
)

// fakeVM is a VM whose "hypervisor" is a real sleep process, so pids,
// cgroups and the task record behave as with a real one.
type fakeVM struct {
	cmd  *exec.Cmd
	done chan struct{}

	mu           sync.Mutex
	paused       bool
	pauseGate    chan struct{} // if set, Pause blocks until it closes, after a send on pauseEntered
	pauseEntered chan struct{}
	snapshots    []string // "kind:dir" of each link written
	noDiff       bool     // Snapshot refuses diffs as a booted VM's driver does
	closed       bool
	closeErr     error // what Close returns
}

func newFakeVM(t *testing.T) *fakeVM {
	t.Helper()
	cmd := exec.Command("sleep", "3600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	vm := &fakeVM{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(vm.done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-vm.done })
	return vm
}

func (v *fakeVM) PID() int { return v.cmd.Process.Pid }

func (v *fakeVM) Pause(ctx context.Context) error {
	v.mu.Lock()
	gate, entered := v.pauseGate, v.pauseEntered
	v.mu.Unlock()
	if gate != nil {
		entered <- struct{}{}
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.paused = true
	return nil
}

func (v *fakeVM) Resume(context.Context) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.paused = false
	return nil
}

func (v *fakeVM) isPaused() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.paused
}

func (v *fakeVM) Shutdown(ctx context.Context) error {
	_ = v.cmd.Process.Kill()
	return v.Wait(ctx)
}

func (v *fakeVM) Kill() error {
	err := v.cmd.Process.Kill()
	if errors.Is(err, os.ErrProcessDone) {
		return nil
	}
	return err
}

func (v *fakeVM) Wait(ctx context.Context) error {
	select {
	case <-v.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (v *fakeVM) Close() error {
	_ = v.Kill()
	v.mu.Lock()
	defer v.mu.Unlock()
	v.closed = true
	return v.closeErr
}

func (v *fakeVM) exited() bool {
	select {
	case <-v.done:
		return true
	default:
		return false
	}
}

// Snapshot writes a marker link into dir; like the real drivers it
// refuses a running VM, and a diff when noDiff is set.
func (v *fakeVM) Snapshot(_ context.Context, dir string, kind hypervisor.SnapshotKind) error {
	if !v.isPaused() {
		return errors.New("snapshot of a running VM")
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if kind == hypervisor.SnapshotDiff && v.noDiff {
		return fmt.Errorf("fake VM booted: %w", hypervisor.ErrNoDiffBase)
	}
	v.snapshots = append(v.snapshots, string(kind)+":"+dir)
	return os.WriteFile(filepath.Join(dir, "link.json"), []byte(`{"kind":"`+string(kind)+`"}`), 0o600)
}

// liveVM snapshots a running VM and leaves it running, as QEMU does; it
// refuses a paused one, which the service must snapshot with Snapshot.
type liveVM struct{ *fakeVM }

func (v liveVM) SnapshotLive(ctx context.Context, dir string, kind hypervisor.SnapshotKind) error {
	if v.isPaused() {
		return errors.New("live snapshot of a paused VM")
	}
	if err := v.Pause(ctx); err != nil {
		return err
	}
	if err := v.Snapshot(ctx, dir, "live-"+kind); err != nil {
		return err
	}
	return v.Resume(ctx)
}

// plainVM hides fakeVM's Snapshot: a driver that cannot checkpoint.
type plainVM struct{ VM }

// fakeGuest runs a few pretend commands: "echo ARGS", "exit N", "cat"
// (stdin to stdout), "sleep" (until signalled) and "detach" (exits at once
// but leaves stdout open, as a child it left running would, until the
// test closes outW). Its pids count from
// fakeGuestPid, or are all 0 (unknown) when noPids is set.
type fakeGuest struct {
	mu        sync.Mutex
	procs     map[string]*fakeProc
	lastPid   uint32
	noPids    bool
	signalErr error // when set, Signal fails as an unresponsive agent would
	closed    bool
	// execGate, if set, holds Exec until it closes, after a send on
	// execEntered.
	execGate, execEntered chan struct{}
}

type fakeProc struct {
	spec           ProcessSpec
	pid            uint32
	stdinR         *io.PipeReader
	stdinW         *io.PipeWriter
	outR, errR     *io.PipeReader
	outW, errW     *io.PipeWriter
	sig            chan syscall.Signal
	exited         chan struct{}
	exit           Exit
	width, height  uint32
	resizeObserved chan struct{}
}

// fakeGuestPid is the pid before the fake guest's first process's.
const fakeGuestPid = 100

func newFakeGuest() *fakeGuest {
	return &fakeGuest{procs: map[string]*fakeProc{}, lastPid: fakeGuestPid}
}

func (g *fakeGuest) Exec(_ context.Context, spec ProcessSpec) (Started, error) {
	if g.execGate != nil {
		g.execEntered <- struct{}{}
		<-g.execGate
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.procs[spec.ID]; ok {
		return Started{}, fmt.Errorf("process %s exists", spec.ID)
	}
	g.lastPid++
	p := &fakeProc{spec: spec, pid: g.lastPid, sig: make(chan syscall.Signal, 4), exited: make(chan struct{}), resizeObserved: make(chan struct{}, 1)}
	p.stdinR, p.stdinW = io.Pipe()
	p.outR, p.outW = io.Pipe()
	p.errR, p.errW = io.Pipe()
	g.procs[spec.ID] = p
	go p.run()
	s := Started{Pid: p.pid, Streams: Streams{Stdin: p.stdinW, Stdout: p.outR, Stderr: p.errR}}
	if g.noPids {
		s.Pid = 0
	}
	if spec.Terminal {
		s.Stderr = nil
	}
	return s, nil
}

func (p *fakeProc) run() {
	status := uint32(0)
	switch p.spec.Args[0] {
	case "echo":
		fmt.Fprintln(p.outW, strings.Join(p.spec.Args[1:], " "))
	case "exit":
		n, _ := strconv.Atoi(p.spec.Args[1])
		status = uint32(n)
	case "cat":
		_, _ = io.Copy(p.outW, p.stdinR)
	case "sleep":
		status = 128 + uint32(<-p.sig)
	case "detach":
		p.errW.Close()
		p.exit = Exit{At: time.Now()}
		close(p.exited)
		return
	}
	p.outW.Close()
	p.errW.Close()
	p.exit = Exit{Status: status, At: time.Now()}
	close(p.exited)
}

func (g *fakeGuest) proc(id string) (*fakeProc, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	p, ok := g.procs[id]
	if !ok {
		return nil, fmt.Errorf("no process %s", id)
	}
	return p, nil
}

func (g *fakeGuest) Wait(ctx context.Context, id string) (Exit, error) {
	p, err := g.proc(id)
	if err != nil {
		return Exit{}, err
	}
	select {
	case <-p.exited:
		return p.exit, nil
	case <-ctx.Done():
		return Exit{}, ctx.Err()
	}
}

func (g *fakeGuest) Signal(ctx context.Context, id string, sig syscall.Signal) error {
	g.mu.Lock()
	serr := g.signalErr
	g.mu.Unlock()
	if serr != nil {
		return serr
	}
	p, err := g.proc(id)
	if err != nil {
		return err
	}
	select {
	case <-p.exited:
		return fmt.Errorf("process %s has exited: %w", id, errdefs.ErrNotFound)
	default:
	}
	select {
	case <-p.exited:
		return fmt.Errorf("process %s has exited: %w", id, errdefs.ErrNotFound)
	case p.sig <- sig:
		return nil
	}
}

func (g *fakeGuest) ResizePty(_ context.Context, id string, w, h uint32) error {
	p, err := g.proc(id)
	if err != nil {
		return err
	}
	p.width, p.height = w, h
	p.resizeObserved <- struct{}{}
	return nil
}

func (g *fakeGuest) CloseStdin(_ context.Context, id string) error {
	p, err := g.proc(id)
	if err != nil {
		return err
	}
	return p.stdinW.Close()
}

func (g *fakeGuest) Delete(_ context.Context, id string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	p, ok := g.procs[id]
	if !ok {
		return fmt.Errorf("no process %s", id)
	}
	select {
	case <-p.exited:
	default:
		return fmt.Errorf("process %s is running", id)
	}
	delete(g.procs, id)
	return nil
}

func (g *fakeGuest) Processes(context.Context) ([]GuestProcess, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := []GuestProcess{{Pid: 1}}
	for id, p := range g.procs {
		select {
		case <-p.exited:
			continue
		default:
		}
		out = append(out, GuestProcess{Pid: p.pid, ID: id})
	}
	return out, nil
}

func (g *fakeGuest) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	return nil
}

// fakeLauncher hands out one prepared sandbox, reporting its spawn as the
// real launcher does unless silent.
type fakeLauncher struct {
	vm      VM
	guest   *fakeGuest
	err     error
	started chan struct{} // if set, signalled when a launch begins
	gate    chan struct{} // if set, a launch waits for it to close
	// upGate, if set, holds a launch after the spawn, as a guest still
	// coming up would.
	upGate chan struct{}
	silent bool // never call Spawned
	memory MemoryBudget
	// network and base, if set, are the sandbox's Network and Base.
	network, base Releaser
	// host, if set, is the sandbox's Host: a pod's VM.
	host Host
	got  []LaunchRequest
}

func (l *fakeLauncher) Launch(_ context.Context, r LaunchRequest) (*Sandbox, error) {
	if l.gate != nil {
		l.started <- struct{}{}
		<-l.gate
	}
	l.got = append(l.got, r)
	if l.err != nil {
		return nil, l.err
	}
	sb := &Sandbox{
		VM:         l.vm,
		Guest:      l.guest,
		Hypervisor: "fake",
		RunDir:     "/run/cocoon/fake",
		Plan:       state.Plan{Mode: "mmap", Reasons: []string{"best mode the fake offers"}},
		Phases:     []state.Phase{{Name: "spawn", Duration: config.Duration(time.Millisecond)}},
		Memory:     l.memory,
		Network:    l.network,
		Base:       l.base,
		Host:       l.host,
	}
	if r.Spawned != nil && !l.silent {
		r.Spawned(spawnOf(sb))
	}
	if l.upGate != nil {
		<-l.upGate
	}
	return sb, nil
}

// fakeReleaser counts its releases, as a VM's network or base snapshot
// would be released.
type fakeReleaser struct {
	mu sync.Mutex
	n  int
}

func (r *fakeReleaser) Release() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	return nil
}

func (r *fakeReleaser) released() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n > 0
}

// testWait bounds a test's wait for something the shim does on its own.
const testWait = 20 * time.Second

// changes lets a test wait for an update without polling; its owner's
// mutex guards it.
type changes struct{ ch chan struct{} }

// notify wakes every waiter.
func (c *changes) notify() {
	if c.ch != nil {
		close(c.ch)
		c.ch = nil
	}
}

// next is closed by the next notify.
func (c *changes) next() <-chan struct{} {
	if c.ch == nil {
		c.ch = make(chan struct{})
	}
	return c.ch
}

// recorder is an events.Publisher that keeps the topics in order.
type recorder struct {
	mu      sync.Mutex
	events  []any
	changed changes
}

var _ events.Publisher = (*recorder)(nil)

func (r *recorder) Publish(_ context.Context, _ string, e events.Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
	r.changed.notify()
	return nil
}

func (r *recorder) all() []any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]any(nil), r.events...)
}

func (r *recorder) topics() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.events))
	for _, e := range r.events {
		topic := runtime.GetTopic(e)
		if x, ok := e.(*eventstypes.TaskExit); ok {
			topic += ":" + x.ID
		}
		out = append(out, topic)
	}
	return out
}

// waitTopics waits until the recorder holds n events; events are
// published asynchronously, in order.
func (r *recorder) waitTopics(t *testing.T, n int) []string {
	t.Helper()
	timeout := time.After(testWait)
	for {
		r.mu.Lock()
		enough, changed := len(r.events) >= n, r.changed.next()
		r.mu.Unlock()
		if enough {
			return r.topics()
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("events %v: want %d", r.topics(), n)
		}
	}
}
