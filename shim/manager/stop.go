package manager

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bootapi "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/network"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/baseimage"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/spare"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
)

// killTimeout bounds the wait for a SIGKILLed hypervisor to disappear.
const killTimeout = 10 * time.Second

// Stop is `shim delete`: containerd runs it when the task server is gone (a
// crash) or failed to start. It kills the task's VM by its recorded pid,
// releases what the task created and reports the init exit.
func (m *Manager) Stop(ctx context.Context, id string) (shim.StopStatus, error) {
	bundle, err := bundlePath(ctx, id)
	if err != nil {
		return shim.StopStatus{}, err
	}
	removeStaleSocket(ctx, bundle)
	t, err := state.ReadTask(bundle)
	if errors.Is(err, os.ErrNotExist) {
		// The server died before it restored anything: nothing to clean.
		return shim.StopStatus{ExitedAt: time.Now(), ExitStatus: 128 + int(unix.SIGKILL)}, nil
	}
	if err != nil {
		return shim.StopStatus{}, err
	}
	if err := Cleanup(ctx, t); err != nil {
		return shim.StopStatus{}, err
	}
	// containerd runs `delete` after every shim exit and logs its output as
	// warnings, so success stays at debug level.
	log.G(ctx).WithFields(log.Fields{"id": id, "pid": t.PID}).Debug("cleaned up task after its shim was gone")
	if t.Exit != nil {
		return shim.StopStatus{Pid: t.PID, ExitStatus: int(t.Exit.Status), ExitedAt: t.Exit.At}, nil
	}
	return shim.StopStatus{Pid: t.PID, ExitStatus: 128 + int(unix.SIGKILL), ExitedAt: time.Now()}, nil
}

// bundlePath is the bundle of task id. containerd runs `delete` in a bundle
// directory; with grouping that may be a sibling task's, so take its parent.
func bundlePath(ctx context.Context, id string) (string, error) {
	if opts, ok := ctx.Value(shim.OptsKey{}).(shim.Opts); ok && opts.BundlePath != "" {
		return opts.BundlePath, nil
	}
	cwd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find bundle: %w", err)
	}
	return filepath.Join(filepath.Dir(cwd), id), nil
}

// removeStaleSocket removes the server socket a crashed shim left behind
// (pkg/shim removes it only on a clean exit). A socket that still accepts
// belongs to a live server of the task's group and stays.
func removeStaleSocket(ctx context.Context, bundle string) {
	data, err := os.ReadFile(filepath.Join(bundle, "bootstrap.json"))
	if err != nil {
		return
	}
	var params bootapi.BootstrapResult
	if err := json.Unmarshal(data, &params); err != nil || params.Address == "" || shim.CanConnect(params.Address) {
		return
	}
	if err := shim.RemoveSocket(params.Address); err != nil && !errors.Is(err, os.ErrNotExist) {
		log.G(ctx).WithError(err).WithField("address", params.Address).Warn("remove stale shim socket")
	}
}

// Cleanup kills t's hypervisor if it still runs and removes what the task
// created: its cgroup and the VM's run directory, the latter only once the
// kill succeeded. The staged chain belongs
// to the snapshotter and is released when containerd removes the snapshot.
func Cleanup(ctx context.Context, t *state.Task) error {
	var errs []error
	if err := killProcess(t); err != nil {
		errs = append(errs, err)
	}
	// A record written before the hypervisor existed has no pid.
	if err := killNaming(t.RunDir); err != nil {
		errs = append(errs, err)
	}
	killed := len(errs) == 0
	if t.Cgroup != "" {
		if err := deleteCgroup(t.Cgroup); err != nil {
			errs = append(errs, err)
		}
	}
	if n := t.Network; n != nil {
		if err := network.Release(n.NetNS, "", n.Tap); err != nil {
			errs = append(errs, err)
		}
	}
	for _, b := range []*state.Base{t.Base, t.PoolBase} {
		if b == nil {
			continue
		}
		if err := releaseBase(ctx, b); err != nil {
			errs = append(errs, err)
		}
	}
	// While a hypervisor may still run, its run dir stays: a retry finds
	// the process by it, and killNaming scans only while it exists.
	if t.RunDir != "" && killed {
		if err := os.RemoveAll(t.RunDir); err != nil {
			errs = append(errs, fmt.Errorf("remove run dir: %w", err))
		}
	}
	// A killed server's pooled VM (one it was still filling, or closing)
	// died with it; no later fill may come to sweep its run dir.
	if t.RunDir != "" {
		if err := spare.SweepPools(filepath.Dir(t.RunDir)); err != nil {
			log.G(ctx).WithError(err).WithField("id", t.ID).Warn("sweep pooled VMs' run dirs")
		}
	}
	if len(errs) > 0 {
		log.G(ctx).WithError(errors.Join(errs...)).WithField("id", t.ID).Warn("task cleanup incomplete")
	}
	return errors.Join(errs...)
}

// releaseBase removes a crashed task's base snapshot and lease through
// containerd, whose address `shim delete` is given as -address.
func releaseBase(ctx context.Context, b *state.Base) error {
	f := flag.Lookup("address")
	if f == nil || f.Value.String() == "" {
		return fmt.Errorf("release base snapshot %s: containerd's address is unknown (no -address flag)", b.Key)
	}
	client, err := containerd.New(f.Value.String())
	if err != nil {
		return fmt.Errorf("release base snapshot %s: %w", b.Key, err)
	}
	defer client.Close()
	return baseimage.Release(ctx, client, b.Namespace, b.Snapshotter, b.Key)
}

// killProcess SIGKILLs the recorded hypervisor through a pidfd, so a pid
// recycled between the check and the signal is never hit, and waits for it
// to exit.
func killProcess(t *state.Task) error {
	if !t.Running() {
		return nil
	}
	fd, err := unix.PidfdOpen(t.PID, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open hypervisor pid %d: %w", t.PID, err)
	}
	defer unix.Close(fd)
	// The pidfd pins the process: if it is still the VM now, the signal
	// reaches the VM.
	if !t.Running() {
		return nil
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill hypervisor pid %d: %w", t.PID, err)
	}
	return waitPidfd(fd, t.PID)
}

// waitPidfd waits until the process behind fd has exited; the pidfd becomes
// readable then.
func waitPidfd(fd, pid int) error {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	deadline := time.Now().Add(killTimeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("hypervisor pid %d still runs %s after SIGKILL", pid, killTimeout)
		}
		n, err := unix.Poll(fds, int(left.Milliseconds()))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("wait for hypervisor pid %d: %w", pid, err)
		}
		if n > 0 {
			return nil
		}
	}
}
