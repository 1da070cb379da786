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

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/restore"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/baseimage"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
)

// PhasePlan is the report's phase for loading the config, reading the
// staged chain and deciding the plan.
const PhasePlan = "plan"

// Launcher restores VMs with the driver the config names.
type Launcher struct {
	// NewDriver builds the driver from the config; restore.NewDriver when nil.
	NewDriver func(config.Config) (hypervisor.Driver, error)

	mu      sync.Mutex
	drivers map[string]hypervisor.Driver // by driver config, see driver
	clients baseimage.Clients
}

var _ task.Launcher = (*Launcher)(nil)

// Launch restores r's staged chain into a running VM with a ready agent.
func (l *Launcher) Launch(ctx context.Context, r task.LaunchRequest) (*task.Sandbox, error) {
	began := time.Now()
	cfg, err := loadConfig(r)
	if err != nil {
		return nil, fmt.Errorf("load config: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	d, err := l.driver(cfg)
	if err != nil {
		return nil, err
	}
	src, err := l.source(ctx, cfg, r)
	if err != nil {
		return nil, err
	}
	sb, err := l.launch(ctx, cfg, d, r, src, began)
	if err != nil {
		return nil, errors.Join(err, src.base.Release())
	}
	return sb, nil
}

// source is what a task restores from: a staged chain, and for an ordinary
// image the base snapshot staged for it and the image's filesystem.
type source struct {
	dir  string
	base *baseimage.Snapshot
	disk *chain.StagedRootfs
}

// source stages the runtime class's base image for a task whose image is
// an ordinary one; a snapshot image's chain is staged already.
func (l *Launcher) source(ctx context.Context, cfg config.Config, r task.LaunchRequest) (source, error) {
	if r.Rootfs == nil {
		return source{dir: r.StagedDir}, nil
	}
	if cfg.Restore.BaseImage == "" {
		return source{}, fmt.Errorf("the task's image is an ordinary OCI image, which runs in a VM restored from the runtime class's base snapshot: set restore.base_image: %w", errdefs.ErrInvalidArgument)
	}
	client, err := l.clients.Get(r.Containerd)
	if err != nil {
		return source{}, err
	}
	base, err := baseimage.Stage(ctx, client, r.Namespace, cfg.Restore.BaseSnapshotter, cfg.Restore.BaseImage, r.ID)
	if err != nil {
		return source{}, err
	}
	return source{dir: base.Dir, base: base, disk: r.Rootfs}, nil
}

func (l *Launcher) launch(ctx context.Context, cfg config.Config, d hypervisor.Driver, r task.LaunchRequest, src source, began time.Time) (*task.Sandbox, error) {
	plan, top, err := decide(ctx, d, cfg, r, src.dir)
	if err != nil {
		return nil, err
	}
	budget := task.MemoryBudget{Guest: top.MemoryBytes, Headroom: int64(cfg.Shim.MemoryHeadroom)}
	if err := budget.Check(resourcesOf(r.Spec)); err != nil {
		return nil, err
	}
	runDir, err := runDirOf(cfg, r)
	if err != nil {
		return nil, err
	}
	// The plan phase is the shim's own work before the hypervisor starts
	// (config, driver, chain, policy), so the report's total misses nothing.
	planned := restore.Phase{Name: PhasePlan, Duration: time.Since(began)}
	ctx, cancel := context.WithTimeout(ctx, cfg.Shim.RestoreTimeout.D())
	defer cancel()
	vnet, err := openNetwork(r.Spec, r.ID)
	if err != nil {
		return nil, err
	}
	netns, nic := vnet.attach()
	spawn := task.Spawn{Hypervisor: d.Name(), RunDir: runDir, Plan: planRecord(plan), Memory: budget, Network: vnet.record(), Base: src.record()}
	res, err := restore.Run(ctx, loadedDriver{Driver: d, req: r, spawn: spawn, net: vnet}, restore.Request{
		StagedDir:    src.dir,
		RunDir:       runDir,
		Plan:         plan,
		Hostname:     r.Hostname,
		AgentTimeout: cfg.Agent.ConnectTimeout.D(),
		NetNS:        netns,
		NIC:          nic,
		Disk:         src.diskPath(),
	})
	if err != nil {
		return nil, errors.Join(err, vnet.Release())
	}
	return &task.Sandbox{
		VM:            res.VM,
		Guest:         NewGuest(res.Agent, cfg.Agent.CallTimeout.D()),
		Hypervisor:    d.Name(),
		RunDir:        runDir,
		Plan:          planRecord(plan),
		Phases:        phaseRecords(append([]restore.Phase{planned}, res.Report.Phases...)),
		Memory:        budget,
		Network:       vnet,
		NetworkRecord: spawn.Network,
		Base:          src.base,
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

// loadConfig is the task's config: the runtime options' inline body, or
// the file they name, else the default file.
func loadConfig(r task.LaunchRequest) (config.Config, error) {
	if r.ConfigBody != "" {
		c, err := config.Parse([]byte(r.ConfigBody))
		if err != nil {
			return config.Config{}, fmt.Errorf("runtime options: %w", err)
		}
		return c, nil
	}
	return config.Load(r.ConfigPath)
}

// resourcesOf is the spec's Linux resources, nil when it has none.
func resourcesOf(spec *specs.Spec) *specs.LinuxResources {
	if spec == nil || spec.Linux == nil {
		return nil
	}
	return spec.Linux.Resources
}

// decide reads the staged chain's top link and asks the policy for a plan.
func decide(ctx context.Context, d hypervisor.Driver, cfg config.Config, r task.LaunchRequest, dir string) (restore.Plan, *chain.Link, error) {
	staged, err := chain.OpenStaged(dir)
	if err != nil {
		return restore.Plan{}, nil, fmt.Errorf("rootfs %s is not a staged cocoon chain (run with --snapshotter cocoon): %w: %w",
			dir, err, errdefs.ErrInvalidArgument)
	}
	caps, err := d.Capabilities(ctx)
	if err != nil {
		return restore.Plan{}, nil, fmt.Errorf("%s capabilities: %w", d.Name(), err)
	}
	var annotations map[string]string
	if r.Spec != nil {
		annotations = r.Spec.Annotations
	}
	plan, err := restore.Decide(restore.Inputs{
		Hypervisor:  d.Name(),
		Caps:        caps,
		Link:        staged.Top(),
		Config:      cfg.Restore,
		Annotations: annotations,
	})
	if err != nil {
		return restore.Plan{}, nil, fmt.Errorf("restore plan: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	entry := log.G(ctx).WithFields(log.Fields{"id": r.ID, "hypervisor": d.Name(), "mode": plan.Mode, "reasons": plan.Reasons})
	if len(plan.Warnings) > 0 {
		entry.WithField("warnings", plan.Warnings).Warn("restore plan")
	} else {
		entry.Info("restore plan")
	}
	return plan, staged.Top(), nil
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

func planRecord(p restore.Plan) state.Plan {
	return state.Plan{
		Mode:             string(p.Mode),
		ReleaseAfterLoad: p.ReleaseAfterLoad,
		Reasons:          p.Reasons,
		Warnings:         p.Warnings,
	}
}

func phaseRecords(phases []restore.Phase) []state.Phase {
	out := make([]state.Phase, 0, len(phases))
	for _, p := range phases {
		out = append(out, state.Phase{Name: p.Name, Duration: state.Duration(p.Duration)})
	}
	return out
}
