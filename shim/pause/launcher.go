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
	"path/filepath"
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

// runDirName is the pause process's run dir in the bundle: empty, it is the
// argument by which `shim delete` finds a pause process spawned by a shim
// that died before recording its pid, as a VM's hypervisor is found by its
// run dir.
const runDirName = "pause"

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
	plan := state.Plan{Mode: "none", Reasons: []string{"pod sandbox: a host process holds the pod's network namespace and cgroup; each app container restores its own VM"}}
	runDir, err := starting(r, plan)
	if err != nil {
		return nil, err
	}
	p, err := spawn(ctx, exe, runDir, netnsPath(r.Spec))
	if err != nil {
		return nil, errors.Join(err, os.Remove(runDir))
	}
	sb := &task.Sandbox{
		VM:         p,
		Guest:      guest{p},
		Hypervisor: Hypervisor,
		RunDir:     runDir,
		Plan:       plan,
		Phases:     []state.Phase{{Name: "spawn", Duration: config.Duration(time.Since(began))}},
	}
	if r.Spawned != nil {
		r.Spawned(task.Spawn{PID: p.PID(), Hypervisor: Hypervisor, RunDir: runDir, Plan: plan})
	}
	if r.Created != nil {
		if err := r.Created(ctx, p.PID()); err != nil {
			return nil, errors.Join(err, p.Close())
		}
	}
	return sb, nil
}

// starting makes the pause process's run dir and records it (the
// LaunchRequest's Starting hook) before the process exists.
func starting(r task.LaunchRequest, plan state.Plan) (string, error) {
	runDir := filepath.Join(r.Bundle, runDirName)
	if err := os.Mkdir(runDir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("create pause run dir: %w", err)
	}
	if r.Starting != nil {
		if err := r.Starting(task.Spawn{Hypervisor: Hypervisor, RunDir: runDir, Plan: plan}); err != nil {
			return "", errors.Join(err, os.Remove(runDir))
		}
	}
	return runDir, nil
}

// spawn starts the pause process, naming runDir, in the network namespace
// at netns, and waits until it is ready.
func spawn(ctx context.Context, exe, runDir, netns string) (*proc, error) {
	ready, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("create pause readiness pipe: %w", err)
	}
	defer ready.Close()
	cmd := &exec.Cmd{Path: exe, Args: []string{hold.Argv0, runDir}, ExtraFiles: []*os.File{w}}
	err = startIn(netns, cmd)
	w.Close()
	if err != nil {
		return nil, err
	}
	p := newProc(cmd, runDir)
	if err := awaitReady(ctx, ready); err != nil {
		return nil, errors.Join(err, p.Close())
	}
	return p, nil
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
