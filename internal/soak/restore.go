package soak

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testimage"
	"github.com/cocoonstack/containerd-shim-cocoon/restore"
)

// Bounds of one restore's steps.
const (
	// exitTimeout bounds the wait for an init exit once it was asked to
	// stop or killed.
	exitTimeout = 90 * time.Second
	// cleanupTimeout bounds deleting a restore's task and container.
	cleanupTimeout = 2 * time.Minute
)

// Outcome is how one restore went.
type Outcome struct {
	Plan Plan
	// Err is a failure: for a restore without a kill anything that went
	// wrong; for a killed one only a task that never exited after the kill
	// or a cleanup that failed.
	Err error
	// KillErr is what the deliberate kill made fail (informational).
	KillErr error
	// Killed says the kill hit its target.
	Killed bool
	Took   time.Duration
	// Steps is how long each step took, in order, to say where a slow
	// restore spent its time.
	Steps []Step
}

// Step is one timed step of a restore.
type Step struct {
	Name string
	Took time.Duration
}

// run is one restore in progress.
type run struct {
	s         *soak
	plan      Plan
	pair      *netPair
	container client.Container
	task      client.Task
	execProc  client.Process // an exec a kill interrupted
	exited    <-chan client.ExitStatus
	stdout    lockedBuffer
	stderr    lockedBuffer
	killed    bool
	steps     []Step
	last      time.Time
	// stuck is set when the task never exited after a kill: a failure
	// even for a killed restore.
	stuck error
	// pod, when set, makes the container a part of a pod (podRole).
	pod *podRole
}

// restore runs plan p through containerd and removes everything it made.
func (s *soak) restore(ctx context.Context, p Plan) Outcome {
	if p.Pod {
		return s.runPod(ctx, p)
	}
	start := time.Now()
	r := &run{s: s, plan: p, last: start}
	err := r.lifecycle(ctx)
	r.step("end")
	cleanup := r.cleanup()
	r.step("cleanup")
	o := Outcome{Plan: p, Killed: r.killed, Took: time.Since(start), Steps: r.steps}
	if p.Kill == nil {
		o.Err = errors.Join(err, cleanup)
	} else {
		o.KillErr = err
		o.Err = errors.Join(r.stuck, cleanup)
	}
	return o
}

// lifecycle creates the container and task, runs the plan's steps and
// checks what the guest printed.
func (r *run) lifecycle(ctx context.Context) error {
	if err := r.createContainer(ctx); err != nil {
		return err
	}
	r.step("container")
	err := r.createTask(ctx)
	if h := r.plan.Hostile; h.refused() {
		r.step("refused")
		return r.s.hostile.checkRefusal(h, err)
	}
	if err != nil {
		return err
	}
	r.step("create")
	if err := r.task.Start(ctx); err != nil {
		return fmt.Errorf("start task: %w", err)
	}
	r.step("start")
	if k := r.plan.Kill; k != nil && k.Point == AfterStart {
		sleep(ctx, k.Delay)
		return r.killAndWait(ctx)
	}
	if r.plan.Exec {
		if err := r.exec(ctx); err != nil || r.killed {
			return err
		}
		r.step("exec")
	}
	return r.finish(ctx)
}

// step records the time since the last step under name.
func (r *run) step(name string) {
	now := time.Now()
	r.steps = append(r.steps, Step{Name: name, Took: now.Sub(r.last)})
	r.last = now
}

func (r *run) createContainer(ctx context.Context) error {
	img := r.s.images[r.plan.Image]
	opts := []oci.SpecOpts{
		oci.WithImageConfig(img),
		oci.WithProcessArgs("sh", "-c", r.script()),
		oci.WithAnnotations(map[string]string{restore.AnnotationMode: string(r.plan.Mode)}),
	}
	switch r.plan.Net {
	case NetHost:
		opts = append(opts, oci.WithHostNamespace(specs.NetworkNamespace))
	case NetPair:
		var err error
		if r.pair, err = r.s.pairs.open(); err != nil {
			return err
		}
		opts = append(opts, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: r.pair.task.Path()}))
	}
	// After the network's, so a hostile namespace path takes its place.
	opts = append(opts, r.s.hostile.specOpt(r.plan.Hostile))
	var runtimeOpts any
	if r.pod != nil {
		opts = append(opts, oci.WithAnnotations(r.pod.annotations()))
		runtimeOpts = r.s.podOptions
	}
	c, err := r.s.client.NewContainer(ctx, r.plan.ID,
		client.WithImage(img),
		client.WithSnapshotter(devstack.Snapshotter),
		client.WithNewSnapshot(r.plan.ID, img),
		client.WithRuntime(devstack.Runtime, runtimeOpts),
		client.WithNewSpec(opts...))
	if err != nil {
		return fmt.Errorf("create container: %w", err)
	}
	r.container = c
	return nil
}

// script is init's shell script: say hello, ping the peer over a veth
// pair, then exit or wait for the soak's SIGTERM.
func (r *run) script() string {
	lines := []string{"echo hello-" + r.plan.ID}
	if r.plan.Image == ImageOrdinary {
		lines = append(lines, "cat "+testimage.RandomFile)
	}
	lines = append(lines, r.plan.Hostile.script()...)
	if r.plan.Net == NetPair {
		lines = append(lines, fmt.Sprintf("ping -c 1 -W 10 %s >/dev/null && echo %s || echo net-failed", peerAddr.IP, netOK))
	}
	switch {
	case r.plan.SelfExit:
		lines = append(lines, fmt.Sprintf("exit %d", exitCode))
	case r.pod != nil:
		// Pid 1 of its PID namespace, as a pod's processes are, gets no
		// signal it does not handle: the soak's SIGTERM needs a trap.
		lines = append(lines, "trap 'exit 143' TERM", "sleep 600 & wait")
	default:
		lines = append(lines, "exec sleep 600")
	}
	return strings.Join(lines, "\n")
}

// createTask creates the task, under a kill when the plan says so.
func (r *run) createTask(ctx context.Context) error {
	ioc := cio.NewCreator(cio.WithStreams(nil, &r.stdout, &r.stderr), cio.WithFIFODir(r.s.stack.FifoDir))
	var wg sync.WaitGroup
	created := make(chan struct{})
	if k := r.plan.Kill; k != nil && k.Point == DuringCreate {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.killDuringCreate(ctx, created)
		}()
	}
	t, err := r.container.NewTask(ctx, ioc)
	close(created)
	wg.Wait()
	if err != nil {
		return fmt.Errorf("create task: %w", err)
	}
	r.task = t
	if r.exited, err = r.task.Wait(ctx); err != nil {
		return fmt.Errorf("wait task: %w", err)
	}
	if r.killed {
		return r.waitExit(ctx)
	}
	return nil
}

// exec runs a process beside init and checks its output, or kills the
// task's parts while it runs.
func (r *run) exec(ctx context.Context) error {
	spec, err := r.task.Spec(ctx)
	if err != nil {
		return fmt.Errorf("task spec: %w", err)
	}
	ps := *spec.Process
	ps.Args = []string{"sh", "-c", "echo exec-" + r.plan.ID}
	k := r.plan.Kill
	if k != nil && k.Point == DuringExec {
		ps.Args[2] += "; exec sleep 600"
	}
	var out lockedBuffer
	p, err := r.task.Exec(ctx, "x", &ps, cio.NewCreator(cio.WithStreams(nil, &out, &out), cio.WithFIFODir(r.s.stack.FifoDir)))
	if err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	exited, err := p.Wait(ctx)
	if err != nil {
		return fmt.Errorf("wait exec: %w", err)
	}
	if err := p.Start(ctx); err != nil {
		return fmt.Errorf("start exec: %w", err)
	}
	if k != nil && k.Point == DuringExec {
		r.execProc = p
		sleep(ctx, k.Delay/3)
		return r.killAndWait(ctx)
	}
	st, err := waitStatus(ctx, exited)
	if err == nil {
		err = st.Error()
	}
	if err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	if err := waitIO(ctx, p); err != nil {
		return err
	}
	if _, err := p.Delete(ctx); err != nil {
		return fmt.Errorf("delete exec: %w", err)
	}
	want := "exec-" + r.plan.ID + "\n"
	if st.ExitCode() != 0 || out.String() != want {
		return fmt.Errorf("exec exited %d printing %q, want 0 and %q", st.ExitCode(), out.String(), want)
	}
	return nil
}

// finish ends init (on its own or by SIGTERM), deletes the task and checks
// its exit status and output.
func (r *run) finish(ctx context.Context) error {
	want := uint32(exitCode)
	if !r.plan.SelfExit {
		want = 128 + uint32(syscall.SIGTERM)
		// A SIGTERM before init printed would end it mid-script.
		if err := r.waitOutput(ctx); err != nil {
			return err
		}
		if err := r.task.Kill(ctx, syscall.SIGTERM); err != nil {
			return fmt.Errorf("stop task: %w", err)
		}
	}
	st, err := waitStatus(ctx, r.exited)
	if err == nil {
		err = st.Error()
	}
	if err != nil {
		return fmt.Errorf("task: %w", err)
	}
	if err := waitIO(ctx, r.task); err != nil {
		return err
	}
	t := r.task
	r.task = nil
	if _, err := t.Delete(ctx); err != nil {
		return fmt.Errorf("delete task: %w", err)
	}
	if st.ExitCode() != want {
		return fmt.Errorf("task exited %d, want %d (stdout %q, stderr %q)", st.ExitCode(), want, r.stdout.String(), r.stderr.String())
	}
	return r.checkOutput()
}

// netOK is what init prints once it reached its veth peer.
const netOK = "net-ok"

// checkOutput checks what init printed: its hello, from an ordinary image
// the file only that image holds, and over a veth pair that it reached the
// peer.
func (r *run) checkOutput() error {
	out := r.stdout.String()
	want := []string{"hello-" + r.plan.ID}
	if r.plan.Image == ImageOrdinary {
		want = append(want, strings.TrimSuffix(r.s.randomContent, "\n"))
	}
	if r.plan.Net == NetPair {
		want = append(want, netOK)
	}
	if p := r.plan.Hostile.printed(); p != "" {
		want = append(want, p)
	}
	if err := checkLeak(out, r.stderr.String()); err != nil {
		return err
	}
	for _, w := range want {
		if !strings.Contains(out, w+"\n") {
			return fmt.Errorf("init printed %q (stderr %q), want a line %s", out, r.stderr.String(), w)
		}
	}
	return nil
}

// waitOutput waits until init has printed its line, at most exitTimeout.
func (r *run) waitOutput(ctx context.Context) error {
	deadline := time.Now().Add(exitTimeout)
	for {
		err := r.checkOutput()
		if err == nil {
			return nil
		}
		if strings.Contains(r.stdout.String(), "net-failed\n") {
			return fmt.Errorf("the guest could not ping its veth peer: %w", err)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("after %s: %w", exitTimeout, err)
		}
		sleep(ctx, 50*time.Millisecond)
	}
}

// cleanup deletes the task and the container with its snapshot, and the
// network pair, whatever state they are in.
func (r *run) cleanup() error {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	var errs []error
	if r.execProc != nil {
		if err := deleteProcess(ctx, r.execProc); err != nil {
			errs = append(errs, fmt.Errorf("exec: %w", err))
		}
	}
	if r.task != nil {
		if err := deleteProcess(ctx, r.task); err != nil {
			errs = append(errs, err)
		}
	}
	if r.container != nil {
		if err := deleteContainer(ctx, r.container); err != nil {
			errs = append(errs, err)
		}
	}
	if r.pair != nil {
		if err := r.s.pairs.close(r.pair); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// deleteProcess deletes a task or exec, killing it first if it runs.
// While containerd cleans up after a dead shim the delete fails (the
// shim's connection is closed), so it tries again; once containerd has
// removed the task itself, the client leaves the FIFOs to the caller.
func deleteProcess(ctx context.Context, p client.Process) error {
	for {
		_, err := p.Delete(ctx, client.WithProcessKill)
		if err == nil {
			return nil
		}
		if isGone(err) {
			if ioc := p.IO(); ioc != nil {
				ioc.Cancel()
				return ioc.Close()
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("delete %s: %w", p.ID(), err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// deleteContainer deletes c with its snapshot; containerd refuses while a
// task it cleans up after a crash is still listed, so it tries again.
func deleteContainer(ctx context.Context, c client.Container) error {
	for {
		err := c.Delete(ctx, client.WithSnapshotCleanup)
		if err == nil || isGone(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("delete container: %w", err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// waitIO waits until p's output has reached the soak: the shim closes a
// process's streams before it reports the exit. Delete alone would cancel
// a FIFO open the client has not seen complete yet (containerd's cio opens
// them in the background), and a loaded host can delay that long enough
// to lose the output of a process that was quick to exit.
func waitIO(ctx context.Context, p client.Process) error {
	done := make(chan struct{})
	go func() {
		p.IO().Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-time.After(exitTimeout):
		return fmt.Errorf("%s's output streams still open %s after its exit", p.ID(), exitTimeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitStatus waits for an exit status, at most exitTimeout; the status may
// carry an error (the shim is gone).
func waitStatus(ctx context.Context, exited <-chan client.ExitStatus) (client.ExitStatus, error) {
	select {
	case st := <-exited:
		return st, nil
	case <-time.After(exitTimeout):
		return client.ExitStatus{}, fmt.Errorf("no exit within %s", exitTimeout)
	case <-ctx.Done():
		return client.ExitStatus{}, ctx.Err()
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// lockedBuffer is a bytes.Buffer safe for containerd's copy goroutines and
// the reader.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
