// Package qemu drives QEMU (qemu-system-x86_64, microvm machine) over QMP:
// cold boot with guest RAM in a shared file (for baking snapshots), full
// and diff snapshots into chain links (live, the guest stopped only while
// its state is captured), and restores of staged chains in copy or mmap
// mode, the top links of a chain staged with deltas written into the
// guest. Each VM is one supervised process with a private run directory.
package qemu

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"

	"github.com/containerd/log"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/vmmproc"
)

// Name is the hypervisor name in chain links.
const Name = hypervisor.QEMU

var (
	_ hypervisor.Driver        = (*Driver)(nil)
	_ hypervisor.BuildReporter = (*Driver)(nil)
)

// Driver restores and boots QEMU VMs.
type Driver struct {
	cfg  config.QEMU
	host host

	mu    sync.Mutex
	build string
}

// New returns a driver for cfg. Nothing is probed until first use.
func New(cfg config.QEMU) *Driver {
	if cfg.Binary == "" {
		cfg.Binary = config.Default().QEMU.Binary
	}
	return &Driver{cfg: cfg, host: realHost}
}

// Name is "qemu".
func (d *Driver) Name() string { return Name }

// Capabilities: mmap and copy restores, full and diff snapshots. QEMU
// cannot restore lazily from a file (postcopy needs a live source), so no
// ondemand. The changed pages a diff holds are found by the driver, not
// QEMU (see Snapshot), so every build has them.
// They hold for every build, so nothing is probed: running the binary
// would cost every restore ~20 ms. Build is filled in only once known.
func (d *Driver) Capabilities(context.Context) (hypervisor.Capabilities, error) {
	d.mu.Lock()
	build := d.build
	d.mu.Unlock()
	return hypervisor.Capabilities{
		RestoreModes:  []hypervisor.Mode{hypervisor.ModeMmap, hypervisor.ModeCopy},
		SnapshotKinds: []hypervisor.SnapshotKind{hypervisor.SnapshotFull, hypervisor.SnapshotDiff},
		Build:         build,
	}, nil
}

// Build is the first line of `qemu-system-x86_64 --version`, probed on
// first success and kept.
func (d *Driver) Build(ctx context.Context) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.build != "" {
		return d.build, nil
	}
	out, err := exec.CommandContext(ctx, d.cfg.Binary, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("probe %s --version: %w", d.cfg.Binary, err)
	}
	line, _, _ := bytes.Cut(out, []byte("\n"))
	d.build = string(bytes.TrimSpace(line))
	return d.build, nil
}

// BootSpec is a cold boot from a kernel and initramfs.
type BootSpec struct {
	Kernel, Initrd, Cmdline string
	MemoryBytes             int64
	VCPUs                   int
	// DiskSlots is how many spare disk slots the VM gets, empty, for
	// AttachDisk (0 to MaxDiskSlots). Its snapshots and their restores
	// have them too.
	DiskSlots int
	// RunDir is created for the VM and removed by Close or on failure.
	RunDir string
	// MemPath is the guest RAM file (created, mapped shared); empty puts
	// it in RunDir.
	MemPath string
}

// Accel is the accelerator a boot on this host would use (kvm or tcg) and
// why: the config's choice, else the probe.
func (d *Driver) Accel() (accel, reason string, err error) {
	return chooseAccel(d.cfg.Accel, d.host)
}

// Boot cold-boots a VM with its RAM in a shared file, running. It is the
// source a snapshot is baked from: its NIC has no backend and its rootfs
// and spare disk slots are empty, so every restore chooses the first two
// and AttachDisk fills the others.
func (d *Driver) Boot(ctx context.Context, spec BootSpec) (*VM, error) {
	// QEMU runs in its run directory: every path it is given is absolute.
	for _, p := range []*string{&spec.Kernel, &spec.Initrd, &spec.RunDir, &spec.MemPath} {
		if *p == "" {
			continue
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			return nil, fmt.Errorf("boot spec path %s: %w", *p, err)
		}
		*p = abs
	}
	accel, cpu, reason, err := d.hostMachine()
	if err != nil {
		return nil, err
	}
	log.G(ctx).WithField("accel", accel).WithField("reason", reason).Debug("qemu accelerator")
	if accel == accelTCG {
		spec.Cmdline = tcgCmdline(spec.Cmdline)
	}
	shape := Shape{
		Version: shapeVersion, Machine: machineType, Accel: accel,
		CPU: cpu, VCPUs: spec.VCPUs, MemoryBytes: spec.MemoryBytes,
		Devices: machineDevices(spec.DiskSlots), DiskSlots: spec.DiskSlots, Cmdline: spec.Cmdline,
	}
	if err := shape.Validate(); err != nil {
		return nil, fmt.Errorf("boot spec: %w", err)
	}
	if spec.MemPath == "" {
		spec.MemPath = filepath.Join(spec.RunDir, "memory")
	}
	l := launch{
		Shape: shape, Accel: accel, CPU: cpu, Memory: memory{Path: spec.MemPath, Share: true},
		Kernel: spec.Kernel, Initrd: spec.Initrd,
	}
	v, err := d.spawnVM(ctx, spec.RunDir, l, attach{}, false)
	if err != nil {
		return nil, err
	}
	v.memPath = spec.MemPath
	if err := v.Resume(ctx); err != nil {
		v.Close()
		return nil, err
	}
	return v, nil
}

// spawnVM creates runDir, starts QEMU on l with a's files and returns once
// QMP answers. The VM owns a.memfd from here, so a snapshot can read it.
// On error QEMU is gone, a.memfd closed and runDir removed.
func (d *Driver) spawnVM(ctx context.Context, runDir string, l launch, a attach, detach bool) (*VM, error) {
	v, err := d.startVM(ctx, runDir, l, a, detach)
	if err != nil {
		if a.memfd != nil {
			a.memfd.Close()
		}
		return nil, err
	}
	if a.memfd != nil {
		v.memfd = a.memfd
		v.memPath = fmt.Sprintf("/proc/self/fd/%d", a.memfd.Fd())
	}
	return v, nil
}

func (d *Driver) startVM(ctx context.Context, runDir string, l launch, a attach, detach bool) (*VM, error) {
	extra, tapFD := a.files()
	l.QMPFD, l.TapFD = qmpChildFD, tapFD
	l.AgentSock = filepath.Join(runDir, agentSock)
	l.SerialLog = filepath.Join(runDir, serialLog)
	// agent.sock is the longest socket name in the run dir.
	if err := vmmproc.CheckSockPath(l.AgentSock); err != nil {
		return nil, err
	}
	if err := vmmproc.MakeRunDir(runDir); err != nil {
		return nil, err
	}
	sctx, cancel := vmmproc.WithDefaultTimeout(ctx, startTimeout)
	defer cancel()
	proc, q, err := start(sctx, spawn{binary: d.cfg.Binary, args: l.args(), runDir: runDir, extra: extra, netns: a.netns, bornIn: a.bornIn, detach: detach})
	if err != nil {
		os.RemoveAll(runDir)
		return nil, fmt.Errorf("start qemu: %w", err)
	}
	log.G(ctx).WithField("pid", proc.PID()).WithField("rundir", runDir).Debug("qemu started")
	return &VM{proc: proc, qmp: q, runDir: runDir, shape: l.Shape}, nil
}
