package container

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"

	runc "github.com/containerd/go-runc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// warmID names the container Warm creates and deletes. No container
// containerd names starts with a dot, so it never meets a real one, in
// runc's root, the state dir or the cgroups.
const warmID = ".warm"

// Warm has runc create a throwaway container and delete it, at idle
// priority. Under TCG a restored guest translates anew all the code it
// runs, and a VM's first `runc create` pays for runc's whole path (its
// start, runc init's namespaces, mounts and masked paths, and the
// kernel's side of them): ~800 ms in a fresh VM against ~280 once run.
// Run while the host prepares a pod's first container, the warm-up
// leaves that container's create less to translate. Under SCHED_IDLE it
// takes only CPU time the guest leaves idle, so a container created
// meanwhile is not slowed by it, only helped by as much as it got done.
// With own, the agent's own container init makes it instead, for a pod
// whose containers it makes (CreateOptions.OwnInit).
func (m *Manager) Warm(ctx context.Context, own bool) error {
	errc := make(chan error, 1)
	go func() {
		// A child inherits its forking thread's policy; the thread is
		// never unlocked, so it ends with the goroutine.
		runtime.LockOSThread()
		if err := unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}, 0); err != nil {
			errc <- fmt.Errorf("set SCHED_IDLE: %w", err)
			return
		}
		if own {
			errc <- m.warmOwn(ctx)
			return
		}
		errc <- m.warmCreate(ctx)
	}()
	return <-errc
}

// warmCreate has runc create the throwaway container in a bundle of its
// own and removes it all, whatever the create did: its init, orphaned
// when runc create exits, is the agent's to reap once its delete killed
// it.
func (m *Manager) warmCreate(ctx context.Context) error {
	bundle, _, err := m.warmBundle()
	if err != nil {
		return err
	}
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return errors.Join(fmt.Errorf("open %s: %w", os.DevNull, err), os.RemoveAll(bundle))
	}
	defer null.Close()
	rt := m.engine(bundle, false).(runcEngine).rt
	// go-runc forks a runc with a parent-death signal from a thread of
	// its own, which would not be idle; the agent outliving its runc is
	// all that signal is for, and a warm-up's runc ends by itself.
	rt.PdeathSignal = 0
	init, err := warmInit(ctx, rt, bundle, m.cfg.CgroupParent, null)
	// Its init waits on the exec fifo until deleted; a create cut short
	// by ctx may have left it, or nothing.
	if derr := rt.Delete(context.WithoutCancel(ctx), warmID, &runc.DeleteOpts{Force: true}); derr != nil && err == nil {
		err = fmt.Errorf("delete warm-up container: %w", derr)
	}
	if init != nil {
		_ = init.Kill()
		_, _ = init.Wait()
	}
	return errors.Join(err, os.RemoveAll(bundle))
}

// warmBundle makes the agent the subreaper, so a warm-up's init, left
// by its maker, is the agent's to reap, and makes the throwaway
// container's bundle and empty root.
func (m *Manager) warmBundle() (bundle, root string, err error) {
	if err := subreaper(); err != nil {
		return "", "", err
	}
	bundle = filepath.Join(m.cfg.StateDir, warmID)
	root = filepath.Join(bundle, "rootfs")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return "", "", fmt.Errorf("make warm-up bundle: %w", err)
	}
	return bundle, root, nil
}

// warmOwn has the agent's own container init make the throwaway
// container, which waits for a start that never comes, and removes it
// all. Its forks come from this idle thread, so the init is idle too.
func (m *Manager) warmOwn(ctx context.Context) error {
	bundle, root, err := m.warmBundle()
	if err != nil {
		return err
	}
	c := &Container{ID: warmID, bundle: bundle, cgroup: path.Join(m.cfg.CgroupParent, warmID)}
	e := m.engine(bundle, true)
	pid, io, err := e.create(ctx, c, warmSpec(root, m.cfg.CgroupParent), false)
	if err != nil {
		return errors.Join(fmt.Errorf("create warm-up container: %w", err), os.RemoveAll(bundle))
	}
	io.close()
	err = e.remove(context.WithoutCancel(ctx), c)
	if init, ferr := os.FindProcess(pid); ferr == nil {
		_, _ = init.Wait()
	}
	return errors.Join(err, os.RemoveAll(bundle))
}

// warmInit has runc create the throwaway container and returns its init.
func warmInit(ctx context.Context, rt *runc.Runc, bundle, cgroupParent string, null *os.File) (*os.Process, error) {
	if err := writeSpec(bundle, warmSpec(filepath.Join(bundle, "rootfs"), cgroupParent)); err != nil {
		return nil, err
	}
	pidFile := filepath.Join(bundle, "init.pid")
	if err := rt.Create(ctx, warmID, bundle, &runc.CreateOpts{IO: nullIO{null}, PidFile: pidFile}); err != nil {
		return nil, fmt.Errorf("create warm-up container: %w", runcError(bundle, err))
	}
	pid, err := readPid(pidFile)
	if err != nil {
		return nil, err
	}
	// A pidfd: the process itself, whatever its pid becomes.
	return os.FindProcess(pid)
}

// nullIO gives runc /dev/null for its stdio and the init's. Without IO,
// go-runc copies runc's output through a pipe, which the init holds open
// while it waits to be started: the create would not return.
type nullIO struct{ f *os.File }

func (n nullIO) Close() error          { return nil }
func (n nullIO) Stdin() io.WriteCloser { return nil }
func (n nullIO) Stdout() io.ReadCloser { return nil }
func (n nullIO) Stderr() io.ReadCloser { return nil }
func (n nullIO) Set(c *exec.Cmd)       { c.Stdin, c.Stdout, c.Stderr = n.f, n.f, n.f }

// warmSpec is a container the way a pod's come to the guest: its own
// PID, IPC, UTS and mount namespaces, the usual mounts, masked and
// read-only paths. It is never started: its process need only exist, as
// runc init looks it up before it waits.
func warmSpec(root, cgroupParent string) *specs.Spec {
	return &specs.Spec{
		Version: specs.Version,
		Root:    &specs.Root{Path: root},
		Process: &specs.Process{
			Args: []string{"/proc/self/exe"}, Cwd: "/", Env: []string{"PATH=/"},
			NoNewPrivileges: true,
			Capabilities:    &specs.LinuxCapabilities{Bounding: []string{"CAP_CHOWN"}, Effective: []string{"CAP_CHOWN"}, Permitted: []string{"CAP_CHOWN"}},
			Rlimits:         []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024}},
		},
		Hostname: "warm",
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: path.Join(cgroupParent, warmID),
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
			},
			MaskedPaths:   []string{"/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"},
			ReadonlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
	}
}

// Warm is the manager's Warm.
func (r *RPC) Warm(ctx context.Context, own bool) error { return r.m.Warm(ctx, own) }
