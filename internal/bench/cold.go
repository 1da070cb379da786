package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/qemu"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/stackrun"
	"github.com/cocoonstack/containerd-shim-cocoon/restore"
)

// coldArm boots the snapshot's guest instead of restoring it: the QEMU
// driver's Boot of the same kernel, initramfs, command line, vCPUs and
// memory, up to a ready agent and benchArgs started. It is what a VM
// runtime without snapshots pays.
type coldArm struct {
	driver *qemu.Driver
	spec   qemu.BootSpec // all but RunDir and MemPath
	dir    string        // the clones' run dirs go here
	// memDir holds the guest RAM files, on tmpfs as anonymous memory
	// would be: a file on disk would be written back while the guest
	// runs and after, slowing whatever runs next.
	memDir string
}

// memDirParent is the tmpfs the guest RAM files go on.
const memDirParent = "/dev/shm"

// newColdArm reads the machine the snapshot was baked on from its shape,
// so the boot matches it (the command line already has the TSC hint a TCG
// boot adds, so Boot does not measure the TSC again).
func newColdArm(img stackrun.SnapshotImage, guest, dir string) (*coldArm, error) {
	shape, err := qemu.ReadShape(filepath.Join(img.LinkDir, qemu.ShapeFile))
	if err != nil {
		return nil, fmt.Errorf("cold boot: snapshot shape: %w", err)
	}
	cfg, err := config.Load("")
	if err != nil {
		return nil, err
	}
	memDir, err := os.MkdirTemp(memDirParent, "cocoon-bench-")
	if err != nil {
		return nil, fmt.Errorf("cold boot: guest RAM dir: %w", err)
	}
	return &coldArm{
		memDir: memDir,
		driver: qemu.New(cfg.QEMU),
		spec: qemu.BootSpec{
			Kernel: filepath.Join(guest, "vmlinuz"), Initrd: filepath.Join(guest, "initramfs.cpio.gz"),
			Cmdline: shape.Cmdline, MemoryBytes: shape.MemoryBytes, VCPUs: shape.VCPUs,
		},
		dir: dir,
	}, nil
}

func (a *coldArm) start(ctx context.Context, id string) (*clone, error) {
	spec := a.spec
	spec.RunDir, spec.MemPath = filepath.Join(a.dir, id), filepath.Join(a.memDir, id)
	start := time.Now()
	vm, err := a.driver.Boot(ctx, spec)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("cold boot %s: %w", id, err), removeIfAny(spec.MemPath))
	}
	closeVM := func() error { return errors.Join(vm.Close(), removeIfAny(spec.MemPath)) }
	booted := time.Now()
	actx, cancel := context.WithTimeout(ctx, agentTimeout)
	c, err := agent.WaitReady(actx, vm.DialAgent)
	cancel()
	if err != nil {
		return nil, errors.Join(fmt.Errorf("cold boot %s: %w; guest console ends: %s", id, err, consoleTail(vm.SerialLog())), closeVM())
	}
	ready := time.Now()
	stop := func(context.Context) error {
		c.Close()
		return closeVM()
	}
	if err := startProcess(ctx, c); err != nil {
		return nil, errors.Join(err, stop(ctx))
	}
	return &clone{
		pid: vm.PID(), guestKiB: spec.MemoryBytes >> 10, ready: time.Since(start), stop: stop,
		phases: []phase{
			{Name: phaseBoot, Duration: booted.Sub(start)},
			{Name: restore.PhaseAgent, Duration: ready.Sub(booted)},
			{Name: phaseStarted, Duration: time.Since(ready)},
		},
	}, nil
}

func (a *coldArm) close() error { return os.RemoveAll(a.memDir) }

func removeIfAny(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// consoleTail is the end of a guest's console log, for an error.
func consoleTail(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	const keep = 1024
	return strings.TrimSpace(string(data[max(len(data)-keep, 0):]))
}
