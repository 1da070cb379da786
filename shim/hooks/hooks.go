// Package hooks runs OCI hooks as runc runs them: each hook's path with
// exactly its args and env, the container's state JSON on stdin, bounded
// by its timeout, in order, stopping at the first failure.
//
// Where and when runc runs each kind (all get the state; its pid is the
// container's init, here the hypervisor process):
//
//   - prestart (deprecated) and then createRuntime: during create, in the
//     runtime's namespaces, once the container's namespaces exist and
//     before pivot_root; status "creating". CNI setup hooks (nerdctl's
//     `oci-hook createRuntime`) run here, so a VM's NIC is connected after
//     them and before the container's process starts.
//   - createContainer: during create, right after createRuntime, in the
//     container's namespaces before pivot_root; status "creating".
//   - startContainer: during start, inside the container after pivot_root,
//     just before the user process is executed; status "created". Its path
//     is resolved in the container's filesystem.
//   - poststart: during start, in the runtime's namespaces, after the user
//     process started and before start returns; status "running".
//   - poststop: during delete, in the runtime's namespaces, after the
//     container is stopped and its resources released; status "stopped".
//
// runc fails the step on a hook's failure: create fails (and the container
// is destroyed) for prestart/createRuntime/createContainer, start kills
// the container on a poststart failure, and delete reports a poststop
// failure after deleting.
package hooks

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// The hook kinds, as the OCI spec names them.
const (
	Prestart        = "prestart"
	CreateRuntime   = "createRuntime"
	CreateContainer = "createContainer"
	StartContainer  = "startContainer"
	Poststart       = "poststart"
	Poststop        = "poststop"
)

const (
	// outputLimit bounds how much of each of a hook's stdout and stderr is
	// kept for its error: the last bytes, where failures are explained.
	outputLimit = 4 << 10
	// outputGrace is how long Run waits, once a hook has exited, for
	// processes it left behind to close its stdout and stderr.
	outputGrace = time.Second
	// MaxTimeout bounds a hook's own timeout, in seconds: a day. The spec
	// counts seconds, so more is a mistake of unit rather than a wish (and
	// 2^34 seconds and up overflow a time.Duration into a timeout that
	// has already passed).
	MaxTimeout = 24 * 60 * 60
)

// State builds the OCI state runc passes to hooks.
func State(id, bundle string, status specs.ContainerState, pid int, annotations map[string]string) specs.State {
	return specs.State{
		Version:     specs.Version,
		ID:          id,
		Status:      status,
		Pid:         pid,
		Bundle:      bundle,
		Annotations: annotations,
	}
}

// Run runs hooks of kind in order, each once, with state as JSON on its
// stdin, and stops at the first that fails. A hook fails when it cannot
// start, exits non-zero, is killed, or outlives its timeout (seconds; a
// hook without one, deadline) or ctx; then its whole process group is
// killed, and the error names the hook (kind, index, path), says how it
// ended and carries the end of its stdout and stderr. A hook that
// succeeds may leave daemons behind, as under runc. Invalid hooks (a
// relative path, a timeout that is not positive or above MaxTimeout) fail
// Run before any hook runs.
//
// runc waits for a hook without a timeout as long as it runs; here one
// such poststop hook would hold a task's delete, and its shim, forever.
func Run(ctx context.Context, kind string, hooks []specs.Hook, state specs.State, deadline time.Duration) error {
	for i, h := range hooks {
		if err := validate(h); err != nil {
			return fmt.Errorf("%s hook %d (%s): %w", kind, i, h.Path, err)
		}
	}
	if len(hooks) == 0 {
		return nil
	}
	stdin, err := json.Marshal(state)
	if err != nil {
		return fmt.Errorf("encode state for %s hooks: %w", kind, err)
	}
	for i, h := range hooks {
		if err := run(ctx, h, stdin, deadline); err != nil {
			return fmt.Errorf("%s hook %d (%s): %w", kind, i, h.Path, err)
		}
	}
	return nil
}

func validate(h specs.Hook) error {
	if !filepath.IsAbs(h.Path) {
		return errors.New("invalid path: want an absolute path")
	}
	if h.Timeout != nil && (*h.Timeout <= 0 || *h.Timeout > MaxTimeout) {
		return fmt.Errorf("invalid timeout %d: want a positive number of seconds, at most %d (a day)", *h.Timeout, MaxTimeout)
	}
	return nil
}

// run runs one hook to its end, and kills its process group if it failed.
func run(ctx context.Context, h specs.Hook, stdin []byte, deadline time.Duration) error {
	hctx, cancel := context.WithTimeout(ctx, timeoutOf(h, deadline))
	defer cancel()
	cmd := command(hctx, h, stdin)
	stdout, stderr := &tail{limit: outputLimit}, &tail{limit: outputLimit}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	err := cmd.Run()
	if err == nil || (errors.Is(err, exec.ErrWaitDelay) && cmd.ProcessState.Success()) {
		// ErrWaitDelay after a clean exit: a daemon it started keeps the
		// output open, which runc tolerates too.
		return nil
	}
	if cmd.Process == nil {
		return fmt.Errorf("start: %w", err)
	}
	// Whatever it started dies with it, on every way of failing.
	_ = killGroup(cmd.Process.Pid)
	return fmt.Errorf("%w; stdout: %q; stderr: %q", ended(ctx, hctx, h, deadline, err), stdout, stderr)
}

// timeoutOf is how long h may run: its own timeout, else deadline.
func timeoutOf(h specs.Hook, deadline time.Duration) time.Duration {
	if h.Timeout != nil {
		return time.Duration(*h.Timeout) * time.Second
	}
	return deadline
}

// command is the hook's process: exactly its argv and environment, in a
// process group of its own that is killed when hctx ends.
func command(hctx context.Context, h specs.Hook, stdin []byte) *exec.Cmd {
	cmd := exec.CommandContext(hctx, h.Path)
	if len(h.Args) > 0 {
		cmd.Args = h.Args
	}
	// A nil Env would make exec inherit the shim's environment. Like
	// runc's (also os/exec), a key given twice keeps its last value.
	cmd.Env = append([]string{}, h.Env...)
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return killGroup(cmd.Process.Pid) }
	cmd.WaitDelay = outputGrace
	return cmd
}

// ended says how a failed hook ended.
func ended(ctx, hctx context.Context, h specs.Hook, deadline time.Duration, err error) error {
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("killed: %w", context.Cause(ctx))
	case hctx.Err() != nil && h.Timeout != nil:
		return fmt.Errorf("killed: timed out after %ds", *h.Timeout)
	case hctx.Err() != nil:
		return fmt.Errorf("killed: it sets no timeout and ran past the runtime's deadline for such hooks (%v, shim.hook_timeout)", deadline)
	case errors.As(err, &exit):
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return fmt.Errorf("killed by signal %s", ws.Signal())
		}
		return fmt.Errorf("exited with status %d", exit.ExitCode())
	default:
		return fmt.Errorf("wait: %w", err)
	}
}

// killGroup SIGKILLs the process group led by pid.
func killGroup(pid int) error {
	err := syscall.Kill(-pid, syscall.SIGKILL)
	if errors.Is(err, syscall.ESRCH) {
		return os.ErrProcessDone
	}
	return err
}
