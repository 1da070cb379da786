package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/docker/go-units"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/qemu"
)

// bake cold-boots the guest on QEMU, waits for its agent, optionally runs a
// warm-up command in it (so the snapshot captures a started service), and
// writes a full chain link of the running guest. The snapshot's NIC has no
// backend and its rootfs slot is empty: every restore chooses both. With
// --image and --archive it also packs the link as an OCI image archive for
// `ctr images import`.
func init() {
	register(command{
		name:    "bake",
		summary: "boot the guest, warm it up and snapshot it into a chain link",
		flags:   bakeFlags,
	})
}

const defaultCmdline = "console=ttyS0 panic=-1 quiet"

// outputDrain bounds the wait for a warm-up command's output after it exited.
const outputDrain = 2 * time.Second

type bakeOptions struct {
	guest, memory, run, out, image, archive, config, cmdline, runDir string
	vcpus, diskSlots                                                 int
	timeout                                                          time.Duration
}

func bakeFlags(fs *flag.FlagSet) action {
	var o bakeOptions
	fs.StringVar(&o.guest, "guest", "build/guest", "guest build `dir`ectory holding vmlinuz and initramfs.cpio.gz")
	fs.StringVar(&o.memory, "memory", "512M", "guest memory `size`")
	fs.IntVar(&o.vcpus, "vcpus", 1, "guest vCPUs")
	fs.IntVar(&o.diskSlots, "disk-slots", 0, fmt.Sprintf("spare disk slots, empty, for containers joining a restored VM (0 to %d; each adds QEMU start-up to every restore)", qemu.MaxDiskSlots))
	fs.StringVar(&o.run, "run", "", "warm-up `command` run in the guest with /bin/sh -c before the snapshot")
	fs.StringVar(&o.out, "out", "", "link `dir`ectory to write (required, must not exist)")
	fs.StringVar(&o.image, "image", "", "image `ref` for --archive")
	fs.StringVar(&o.archive, "archive", "", "also write an OCI image archive `file` of the link")
	fs.StringVar(&o.config, "config", "", "config.toml `file` for the [qemu] section (default $"+config.EnvPath+", else "+config.DefaultPath+", else built-in defaults)")
	fs.StringVar(&o.cmdline, "cmdline", defaultCmdline, "guest kernel command `line`")
	fs.StringVar(&o.runDir, "run-dir", "", "`dir`ectory for the VM's sockets and logs (default a temporary one)")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Minute, "give up after this `duration`")
	return func(ctx context.Context, e env, args []string) error {
		if len(args) > 0 {
			return fmt.Errorf("unexpected arguments %q: bake takes only flags", args)
		}
		return bake(ctx, e.out, e.errOut, o)
	}
}

// bakeSpec is bakeOptions checked and resolved.
type bakeSpec struct {
	boot qemu.BootSpec
	cfg  config.QEMU
	opts bakeOptions
}

func (o bakeOptions) resolve() (bakeSpec, error) {
	switch {
	case o.out == "":
		return bakeSpec{}, errors.New("--out is required: the link directory to write")
	case (o.image == "") != (o.archive == ""):
		return bakeSpec{}, errors.New("--image and --archive go together: the archive needs an image ref")
	case o.vcpus < 1:
		return bakeSpec{}, fmt.Errorf("--vcpus %d: want at least 1", o.vcpus)
	case o.diskSlots < 0 || o.diskSlots > qemu.MaxDiskSlots:
		return bakeSpec{}, fmt.Errorf("--disk-slots %d: want 0 to %d", o.diskSlots, qemu.MaxDiskSlots)
	}
	if _, err := os.Stat(o.out); err == nil {
		return bakeSpec{}, fmt.Errorf("--out %s already exists: bake writes a new link directory", o.out)
	}
	mem, err := units.RAMInBytes(o.memory)
	if err != nil || mem < 64<<20 || mem%(1<<20) != 0 {
		return bakeSpec{}, fmt.Errorf("--memory %q: want a whole number of MiB, at least 64M, such as 512M", o.memory)
	}
	kernel, initrd := filepath.Join(o.guest, "vmlinuz"), filepath.Join(o.guest, "initramfs.cpio.gz")
	for _, f := range []string{kernel, initrd} {
		if _, err := os.Stat(f); err != nil {
			return bakeSpec{}, fmt.Errorf("--guest %s: %w (build it with make guest)", o.guest, err)
		}
	}
	cfg, err := config.Load(o.config)
	if err != nil {
		return bakeSpec{}, err
	}
	return bakeSpec{
		boot: qemu.BootSpec{Kernel: kernel, Initrd: initrd, Cmdline: o.cmdline, MemoryBytes: mem, VCPUs: o.vcpus, DiskSlots: o.diskSlots},
		cfg:  cfg.QEMU,
		opts: o,
	}, nil
}

func bake(ctx context.Context, out, errOut io.Writer, o bakeOptions) (err error) {
	spec, err := o.resolve()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	if spec.boot.RunDir, err = bakeRunDir(o.runDir); err != nil {
		return err
	}
	p := phases{out: out, start: time.Now()}
	vm, err := qemu.New(spec.cfg).Boot(ctx, spec.boot)
	if err != nil {
		if o.runDir == "" {
			os.Remove(filepath.Dir(spec.boot.RunDir))
		}
		return err
	}
	defer func() { err = errors.Join(err, closeBakeVM(vm, o.runDir)) }()
	p.done("boot", fmt.Sprintf("qemu pid %d, run dir %s", vm.PID(), vm.RunDir()))
	if err := warmUp(ctx, vm, o.run, errOut, &p); err != nil {
		return fmt.Errorf("%w (guest console: %s)", err, vm.SerialLog())
	}
	if err := snapshot(ctx, vm, o.out); err != nil {
		return err
	}
	p.done("snapshot", o.out)
	if o.archive != "" {
		if err := writePack(ctx, o.image, []string{o.out}, o.archive); err != nil {
			return err
		}
		p.done("pack", o.archive)
	}
	fmt.Fprintf(out, "bake: total %s\n", time.Since(p.start).Round(time.Millisecond))
	return nil
}

// bakeRunDir returns a run directory that does not exist yet: inside dir
// if given, else inside a fresh temporary directory.
func bakeRunDir(dir string) (string, error) {
	if dir != "" {
		return filepath.Join(dir, "vm"), nil
	}
	tmp, err := os.MkdirTemp("", "cocoon-bake-")
	if err != nil {
		return "", fmt.Errorf("create run dir: %w", err)
	}
	return filepath.Join(tmp, "vm"), nil
}

func closeBakeVM(vm *qemu.VM, runDirFlag string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := errors.Join(vm.Shutdown(ctx), vm.Close())
	if runDirFlag == "" {
		os.Remove(filepath.Dir(vm.RunDir()))
	}
	return err
}

// warmUp waits for the agent and runs the warm-up command. The agent
// connection is closed before returning, so the snapshot captures an agent
// waiting for its next host.
func warmUp(ctx context.Context, vm *qemu.VM, run string, errOut io.Writer, p *phases) error {
	c, err := agent.WaitReady(ctx, vm.DialAgent)
	if err != nil {
		return fmt.Errorf("wait for guest agent: %w", err)
	}
	defer c.Close()
	p.done("agent", "ready")
	if run == "" {
		return nil
	}
	if err := runInGuest(ctx, c, run, errOut); err != nil {
		return err
	}
	p.done("run", run)
	return nil
}

// runInGuest runs /bin/sh -c cmd, copying its output to w; a non-zero exit
// fails the bake.
func runInGuest(ctx context.Context, c *agent.Client, cmd string, w io.Writer) error {
	const id = "bake-warm-up"
	proc, err := c.Exec(ctx, agent.ExecRequest{ID: id, Args: []string{"/bin/sh", "-c", cmd}, Cwd: "/"})
	if err != nil {
		return fmt.Errorf("run %q in guest: %w", cmd, err)
	}
	_, stdout, stderr := proc.Stdio()
	w = &lockedWriter{w: w}
	copied := make(chan struct{}, 2)
	for _, r := range []io.Reader{stdout, stderr} {
		go func() { io.Copy(w, r); copied <- struct{}{} }()
	}
	st, err := c.Wait(ctx, id)
	if err != nil {
		return fmt.Errorf("run %q in guest: %w", cmd, err)
	}
	// A service the command started in the background may hold its
	// output open: wait for the output only briefly.
	drain := time.NewTimer(outputDrain)
	defer drain.Stop()
	for range 2 {
		select {
		case <-copied:
		case <-drain.C:
			return exitError(cmd, st)
		}
	}
	return exitError(cmd, st)
}

func exitError(cmd string, st agent.ExitStatus) error {
	if st.Code != 0 {
		return fmt.Errorf("run %q in guest: exit status %d", cmd, st.Code)
	}
	return nil
}

// lockedWriter serializes the guest's stdout and stderr copies into one writer.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// snapshot pauses the VM and writes the link; a failed snapshot leaves no
// half-written link directory behind.
func snapshot(ctx context.Context, vm *qemu.VM, dir string) error {
	if err := vm.Snapshot(ctx, dir, hypervisor.SnapshotFull); err != nil {
		os.RemoveAll(dir)
		return fmt.Errorf("snapshot: %w", err)
	}
	if _, err := chain.Validate(dir, nil); err != nil {
		os.RemoveAll(dir)
		return fmt.Errorf("snapshot: %w", err)
	}
	return nil
}

// phases prints each phase's duration as it ends.
type phases struct {
	out   io.Writer
	start time.Time
	last  time.Time
}

func (p *phases) done(name, detail string) {
	now := time.Now()
	if p.last.IsZero() {
		p.last = p.start
	}
	fmt.Fprintf(p.out, "bake: %-8s %8s  %s\n", name, now.Sub(p.last).Round(time.Millisecond), detail)
	p.last = now
}
