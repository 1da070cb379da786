// Package vm restores a task's VM for the task service: it loads the
// runtime config, decides the restore plan with the policy helper and runs
// the restore, handing back the VM and its guest agent.
package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/restore"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/baseimage"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
)

// The shim's own phases of a launch: PhasePlan loads the config, reads
// the staged chain, decides the plan and prepares the guest's setup, the
// namespace and the tap; PhaseBase stages the base snapshot of an
// ordinary image through containerd.
const (
	PhasePlan = "plan"
	PhaseBase = "base"
)

// phaseClock times the shim's phases back to back: each lap is the time
// since the previous one, and laps of one name add up.
type phaseClock struct {
	last   time.Time
	phases []restore.Phase
}

func newPhaseClock() *phaseClock { return &phaseClock{last: time.Now()} }

func (c *phaseClock) lap(name string) {
	now := time.Now()
	d := now.Sub(c.last)
	c.last = now
	for i := range c.phases {
		if c.phases[i].Name == name {
			c.phases[i].Duration += config.Duration(d)
			return
		}
	}
	c.phases = append(c.phases, restore.Phase{Name: name, Duration: config.Duration(d)})
}

// lapWithin laps name, less the guest's steps within it, which become
// phases of their own: the report then shows where a guest call's time
// went without counting it twice.
func (c *phaseClock) lapWithin(name string, guest []agent.Phase) {
	for _, p := range guest {
		c.last = c.last.Add(p.Duration)
	}
	c.lap(name)
	for _, p := range guest {
		c.phases = append(c.phases, restore.Phase{Name: restore.GuestPhasePrefix + p.Name, Duration: config.Duration(p.Duration)})
	}
}

// Launcher restores VMs with the driver the config names.
type Launcher struct {
	// NewDriver builds the driver from the config; drivers.New when nil.
	NewDriver func(config.Config) (hypervisor.Driver, error)

	mu      sync.Mutex
	drivers map[string]hypervisor.Driver // by driver config, see driver
	clients baseimage.Clients
	// pool is the VM a spare restored ahead (FillPool), for the first
	// launch; nil when there is none.
	pool *Pool
}

var _ task.Launcher = (*Launcher)(nil)

// Launch restores r's staged chain into a running VM with a ready agent.
func (l *Launcher) Launch(ctx context.Context, r task.LaunchRequest) (*task.Sandbox, error) {
	clock := newPhaseClock()
	cfg, err := config.LoadTask(r.ConfigPath, r.ConfigBody)
	if err != nil {
		return nil, fmt.Errorf("load config: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	d, err := l.driver(cfg)
	if err != nil {
		return nil, err
	}
	if err := starting(cfg, d, r); err != nil {
		return nil, err
	}
	if cfg.Shim.PooledVM {
		if release, err := holdLaunch(cfg.Shim.RunDir); err != nil {
			log.G(ctx).WithError(err).Warn("the spares' fills do not yield to this launch")
		} else {
			defer release()
		}
	}
	src, err := l.source(ctx, cfg, r, clock)
	if err != nil {
		return nil, err
	}
	p, err := prepare(ctx, cfg, d, r, src)
	if err != nil {
		return nil, errors.Join(err, src.base.Release())
	}
	// The plan phase is the shim's own work before the hypervisor starts
	// (config, driver, chain, policy, guest setup, namespace and tap), so
	// the report's total misses nothing.
	clock.lap(PhasePlan)
	sb, restored, err := l.claim(ctx, cfg, d, r, &p)
	if sb == nil && err == nil {
		sb, restored, err = l.run(ctx, cfg, d, r, p)
	}
	if err != nil {
		return nil, errors.Join(err, p.net.Release(), src.base.Release())
	}
	sb.Phases = append(clock.phases, restored...)
	sb.SpareEnv = func(ctx context.Context) []string { return []string{l.spareOrder(ctx, cfg, r, &p)} }
	sb.Spares = cfg.Shim.Spares
	return sb, nil
}

// spareOrder is the environment entry that has the next spare restore a
// VM like this launch's ahead (shim.pooled_vm), or that clears an order
// the server itself was started with. With pooled VMs on, it first sweeps
// the leases dead spares left (a launch that clears the order starts no
// fill, which would).
func (l *Launcher) spareOrder(ctx context.Context, cfg config.Config, r task.LaunchRequest, p *prepared) string {
	if client, err := l.clients.Get(r.Containerd); err == nil && cfg.Shim.PooledVM {
		sweepPoolLeases(ctx, client, r.Namespace)
	}
	o, ok := orderOf(r, p)
	if !ok || !cfg.Shim.PooledVM {
		return PoolEnv + "="
	}
	if o.Image == "" {
		var err error
		if o, err = l.imageOrder(ctx, r, o); err != nil {
			log.G(ctx).WithError(err).Warn("no VM restored ahead of the next task")
			return PoolEnv + "="
		}
	}
	return o.Env()
}

// source is what a task restores from: a staged chain, and for an ordinary
// image the base snapshot staged for it and the image's filesystem.
type source struct {
	dir    string
	staged *chain.Staged // the chain at dir if read already, else nil
	base   *baseimage.Snapshot
	disk   *chain.StagedRootfs
	// why says which of several base snapshots was picked, and why.
	why string
}

// source stages the runtime class's base image (of several, the one that
// fits: baseimage.Pick) for a task whose image is an ordinary one, or for a bare
// pod VM (the report's base phase); a snapshot image's chain is staged
// already.
func (l *Launcher) source(ctx context.Context, cfg config.Config, r task.LaunchRequest, clock *phaseClock) (source, error) {
	if r.Rootfs == nil && !r.Bare {
		return source{dir: r.StagedDir}, nil
	}
	bases := cfg.Restore.Bases()
	if len(bases) == 0 {
		what := "the task's image is an ordinary OCI image, which runs"
		if r.Bare {
			what = "a pod's VM under containerd's sandbox API is"
		}
		return source{}, fmt.Errorf("%s in a VM restored from the runtime class's base snapshot: set restore.base_image (or restore.base_images): %w", what, errdefs.ErrInvalidArgument)
	}
	client, err := l.clients.Get(r.Containerd)
	if err != nil {
		return source{}, err
	}
	clock.lap(PhasePlan)
	base, why, err := baseimage.Pick(ctx, bases, fitOf(r), func(ctx context.Context, image string) (*baseimage.Snapshot, int64, error) {
		b, err := baseimage.Stage(ctx, client, r.Namespace, cfg.Restore.BaseSnapshotter, image, r.ID)
		if err != nil {
			return nil, 0, err
		}
		return b, b.Staged.Top().MemoryBytes, nil
	})
	if err != nil {
		return source{}, err
	}
	clock.lap(PhaseBase)
	src := source{dir: base.Dir, staged: base.Staged, base: base, disk: r.Rootfs, why: why}
	if task.IsCRIPause(r.Spec) {
		// The pod's VM runs the guest's own pause (podPause): its image
		// is not mounted.
		src.disk = nil
	}
	return src, nil
}

// prepared is a restore decided and made ready: its plan, the VM's memory
// budget and run dir, what the guest gets, and its network.
type prepared struct {
	src    source
	staged *chain.Staged
	plan   restore.Plan
	budget task.MemoryBudget
	runDir string
	guest  restore.GuestSetup
	net    *vmNetwork
	// copied are the guest's copies of directories, by host directory;
	// copies bounds all the VM's copies; shares are the VM's shared
	// directories.
	copied map[string]string
	copies *copyBudget
	shares *vmShares
}

func prepare(ctx context.Context, cfg config.Config, d hypervisor.Driver, r task.LaunchRequest, src source) (prepared, error) {
	plan, staged, err := decide(ctx, d, cfg, r, src)
	if err != nil {
		return prepared{}, err
	}
	if src.why != "" {
		plan.Reasons = append([]string{src.why}, plan.Reasons...)
	}
	p := prepared{src: src, staged: staged, plan: plan,
		budget: task.MemoryBudget{Guest: staged.Top().MemoryBytes, Headroom: int64(cfg.Shim.MemoryHeadroom)}}
	if err := p.budget.Check(resourcesOf(r.Spec)); err != nil {
		return prepared{}, err
	}
	if p.runDir, err = runDirOf(cfg, r); err != nil {
		return prepared{}, err
	}
	p.copies = newCopyBudget(cfg.Shim)
	p.shares = newVMShares()
	g, err := guestSetup(r.Spec, src.disk, p.copies, p.shares)
	if err != nil {
		return prepared{}, fmt.Errorf("container of %s: %w", r.ID, err)
	}
	p.guest.Files, p.guest.Rootfs, p.copied = g.files, g.root, g.copied
	if len(g.shares) > 0 {
		p.guest.BeforeInit = func(ctx context.Context, c *agent.Client) error { return p.shares.open(ctx, c, g.shares) }
	}
	p.guest.Process, p.guest.Sysctls = podPause(r), r.Sysctls
	p.guest.WarmContainers = cfg.Shim.WarmRunc && task.IsPodSandbox(r.Spec)
	p.guest.WarmOwnInit = cfg.Shim.OwnInit
	if p.net, err = openNetwork(r.Spec, r.ID); err != nil {
		return prepared{}, err
	}
	p.guest.Network = p.net.guest
	return p, nil
}

// run restores the VM and brings its guest up; the phases are restore.Run's.
func (l *Launcher) run(ctx context.Context, cfg config.Config, d hypervisor.Driver, r task.LaunchRequest, p prepared) (*task.Sandbox, []restore.Phase, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.Shim.RestoreTimeout.D())
	defer cancel()
	netns, nic := p.net.attach()
	spawn := task.Spawn{Hypervisor: d.Name(), RunDir: p.runDir, Plan: p.plan, Memory: p.budget,
		Network: p.net.record(), Base: p.src.record()}
	res, err := restore.Run(ctx, loadedDriver{Driver: d, req: r, spawn: spawn, net: p.net}, restore.Request{
		StagedDir:    p.src.dir,
		Staged:       p.staged,
		RunDir:       p.runDir,
		Plan:         p.plan,
		Hostname:     r.Hostname,
		AgentTimeout: cfg.Agent.ConnectTimeout.D(),
		NetNS:        netns,
		NIC:          nic,
		Disk:         p.src.diskPath(),
		Guest:        p.guest,
	})
	if err != nil {
		p.shares.close(ctx)
		return nil, nil, err
	}
	sb, err := l.sandbox(ctx, cfg, d, r, p, res, spawn)
	if err != nil {
		return nil, nil, err
	}
	return sb, res.Report.Phases, nil
}

// sandbox is the task's view of res, the restored VM of r, up and
// initialised: a pod's VM hosts its containers, a container's copies
// and shares the host's directories it binds.
func (l *Launcher) sandbox(ctx context.Context, cfg config.Config, d hypervisor.Driver, r task.LaunchRequest, p prepared, res *restore.Result, spawn task.Spawn) (*task.Sandbox, error) {
	p.net.forwardPorts(log.WithLogger(context.Background(), log.G(ctx)), res.Agent, cfg.Agent.CallTimeout.D())
	var host task.Host
	guest := NewGuest(res.Agent, cfg.Agent.CallTimeout.D())
	if task.IsPodSandbox(r.Spec) {
		pod, err := newPod(res.VM, res.Agent, p.budget.Guest, cfg.Agent.CallTimeout.D(), p.copies)
		if err != nil {
			p.shares.close(ctx)
			return nil, errors.Join(err, res.VM.Kill(), res.Agent.Close(), res.VM.Close())
		}
		pod.ownInit = cfg.Shim.OwnInit
		if ok, err := res.Agent.CanShare(ctx); err == nil && ok {
			pod.dirs.shares = p.shares
		}
		host, guest = pod, volumeGuest{Guest: pauseGuest{Guest: guest, pod: pod}, live: pod.dirs.live, shares: p.shares}
	} else if live := newLiveVolumes(res.Agent, cfg.Agent.CallTimeout.D(), p.copies); live.watch(ctx, p.copied, p.guest.Files) > 0 || p.shares.serving() {
		guest = volumeGuest{Guest: guest, live: live, shares: p.shares}
	}
	return &task.Sandbox{
		Host:          host,
		VM:            res.VM,
		Guest:         guest,
		Hypervisor:    d.Name(),
		RunDir:        spawn.RunDir,
		Plan:          spawn.Plan,
		Memory:        p.budget,
		Network:       p.net,
		NetworkRecord: spawn.Network,
		Base:          p.src.base,
		BaseRecord:    spawn.Base,
	}, nil
}

func (s source) diskPath() string {
	if s.disk == nil {
		return ""
	}
	return s.disk.ImagePath()
}

func (s source) record() *state.Base {
	if s.base == nil {
		return nil
	}
	return s.base.Record()
}

// resourcesOf is the spec's Linux resources, nil when it has none.
func resourcesOf(spec *specs.Spec) *specs.LinuxResources {
	if spec == nil || spec.Linux == nil {
		return nil
	}
	return spec.Linux.Resources
}

// decide reads the staged chain, once for the whole restore (a base
// image's was read when it was staged), and asks the policy for a plan.
func decide(ctx context.Context, d hypervisor.Driver, cfg config.Config, r task.LaunchRequest, src source) (restore.Plan, *chain.Staged, error) {
	staged := src.staged
	if staged == nil {
		var err error
		if staged, err = chain.OpenStaged(src.dir); err != nil {
			return restore.Plan{}, nil, fmt.Errorf("rootfs %s is not a staged cocoon chain (run with --snapshotter cocoon): %w: %w",
				src.dir, err, errdefs.ErrInvalidArgument)
		}
	}
	var annotations map[string]string
	if r.Spec != nil {
		annotations = r.Spec.Annotations
	}
	plan, _, err := restore.PlanFor(ctx, d, cfg.Restore, staged.Top(), staged, annotations)
	if err != nil {
		return restore.Plan{}, nil, err
	}
	entry := log.G(ctx).WithFields(log.Fields{"id": r.ID, "hypervisor": d.Name(), "mode": plan.Mode, "reasons": plan.Reasons})
	if len(plan.Warnings) > 0 {
		entry.WithField("warnings", plan.Warnings).Warn("restore plan")
	} else {
		entry.Info("restore plan")
	}
	return plan, staged, nil
}

// runDirOf is the VM's private directory, <shim.run_dir>/<namespace>/<id>;
// the driver creates the last element.
func runDirOf(cfg config.Config, r task.LaunchRequest) (string, error) {
	parent := filepath.Join(cfg.Shim.RunDir, r.Namespace)
	if err := os.MkdirAll(parent, 0o711); err != nil {
		return "", fmt.Errorf("create run dir parent: %w", err)
	}
	return filepath.Join(parent, r.ID), nil
}
