// Package pause runs a pod sandbox task without a VM. CRI's sandbox
// container exists only to hold the pod's network namespace and cgroup;
// restoring a VM for it would double the cost of every pod. A small host
// process — the shim's launcher binary, executed as hold.Argv0 — holds
// them instead.
package pause

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/network"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/pause/hold"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
)

// Hypervisor is what a sandbox's task record and report name instead of a
// hypervisor.
const Hypervisor = "none (pod sandbox)"

// readyTimeout bounds the pause process's start.
const readyTimeout = 10 * time.Second

// Launcher starts pod sandbox tasks: a pause process in the pod's network
// namespace. The task service moves it into the pod's cgroup.
type Launcher struct {
	// Binary runs the pause process (package hold): the shim's launcher
	// binary; this process's own binary when empty.
	Binary string
}

var _ task.Launcher = Launcher{}

// Launch starts the pause process; it runs until the task is killed.
func (l Launcher) Launch(ctx context.Context, r task.LaunchRequest) (*task.Sandbox, error) {
	began := time.Now()
	exe, err := l.binary()
	if err != nil {
		return nil, err
	}
	ready, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("create pause readiness pipe: %w", err)
	}
	defer ready.Close()
	cmd := &exec.Cmd{Path: exe, Args: []string{hold.Argv0}, ExtraFiles: []*os.File{w}}
	err = startIn(netnsPath(r.Spec), cmd)
	w.Close()
	if err != nil {
		return nil, err
	}
	p := newProc(cmd)
	if err := awaitReady(ctx, ready); err != nil {
		return nil, errors.Join(err, p.Close())
	}
	sb := &task.Sandbox{
		VM:         p,
		Guest:      guest{p},
		Hypervisor: Hypervisor,
		Plan:       state.Plan{Mode: "none", Reasons: []string{"pod sandbox: a host process holds the pod's network namespace and cgroup; each app container restores its own VM"}},
		Phases:     []state.Phase{{Name: "spawn", Duration: config.Duration(time.Since(began))}},
	}
	if r.Spawned != nil {
		r.Spawned(task.Spawn{PID: p.PID(), Hypervisor: Hypervisor, Plan: sb.Plan})
	}
	if r.Created != nil {
		if err := r.Created(ctx, p.PID()); err != nil {
			return nil, errors.Join(err, p.Close())
		}
	}
	return sb, nil
}

// startIn starts cmd inside the network namespace at path, or in the
// shim's own when path is empty.
func startIn(path string, cmd *exec.Cmd) error {
	if path == "" {
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start pause process: %w", err)
		}
		return nil
	}
	netns, err := network.Open(path)
	if err != nil {
		return fmt.Errorf("open pod network namespace: %w", err)
	}
	defer netns.Close()
	if err := netns.Do(cmd.Start); err != nil {
		return fmt.Errorf("start pause process in %s: %w", path, err)
	}
	return nil
}

// awaitReady waits until the pause process closed its end of the pipe:
// its signal handlers are set, or it died.
func awaitReady(ctx context.Context, ready *os.File) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	if err := ready.SetReadDeadline(time.Now().Add(readyTimeout)); err != nil {
		return fmt.Errorf("wait for pause process: %w", err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := ready.Read(make([]byte, 1))
		done <- err
	}()
	select {
	case err := <-done:
		if errors.Is(err, io.EOF) {
			return nil
		}
		return fmt.Errorf("wait for pause process: %w", err)
	case <-ctx.Done():
		return fmt.Errorf("wait for pause process: %w", ctx.Err())
	}
}

// netnsPath is the network namespace path the spec joins, if any.
func netnsPath(spec *specs.Spec) string {
	if spec == nil || spec.Linux == nil {
		return ""
	}
	for _, n := range spec.Linux.Namespaces {
		if n.Type == specs.NetworkNamespace {
			return n.Path
		}
	}
	return ""
}

// errNoExec is what a sandbox answers to an exec: CRI never asks, and the
// pause process has nothing to run one in.
var errNoExec = errors.New("a pod sandbox runs no processes but its pause process")

func (l Launcher) binary() (string, error) {
	if l.Binary != "" {
		return l.Binary, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find the shim binary: %w", err)
	}
	return exe, nil
}
