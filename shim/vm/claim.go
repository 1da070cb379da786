package vm

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/log"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/restore"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
)

// PhaseClaim is a launch's taking of a pooled VM: the wait for one still
// restoring, its hypervisor back to the normal scheduling policy, its
// warm-up ended (the step under way waited for), its image behind the
// rootfs slot.
const PhaseClaim = "claim"

// errUnusable marks a pooled VM found unusable before its claim changed
// anything (the task's record, cgroup, network, hooks): the launch
// restores a VM of its own, as it would have without a pool.
var errUnusable = errors.New("the pooled VM is not usable")

// usable fails if the pooled VM's hypervisor has exited while it waited
// (killed, crashed). It does not wait: the Wait of an ended context
// reports an exit already reaped, or the context's end.
func (pv *pooledVM) usable(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	cancel()
	switch err := pv.res.VM.Wait(ctx); {
	case errors.Is(err, context.Canceled):
		return nil
	case err == nil:
		return errors.New("its hypervisor exited")
	default:
		return fmt.Errorf("its hypervisor exited: %w", err)
	}
}

// orderOf is the pooled VM a launch of r on p could take, and whether
// one could: an ordinary image on a base, a pod's VM (the base alone), or
// a snapshot image, with no directories shared with the guest. Its
// network may be any: a pooled VM's tap, in a namespace of its own,
// stands for a new one or moves into the one the spec names (CNI's, a
// pod's). A snapshot image's order has no top layer yet (imageOrder).
func orderOf(r task.LaunchRequest, p *prepared) (PoolOrder, bool) {
	// A pod's VM is its base's alone: the guest runs its own pause, or
	// (containerd's sandbox API) none.
	pod := task.IsCRIPause(r.Spec) || r.Bare
	ordinary := p.src.base != nil && (p.src.disk != nil || pod)
	snapshot := p.src.base == nil && p.src.disk == nil && !r.Bare
	if !ordinary && !snapshot || p.guest.BeforeInit != nil {
		return PoolOrder{}, false
	}
	o := PoolOrder{poolKey: poolKey{Containerd: r.Containerd, Namespace: r.Namespace, ConfigPath: r.ConfigPath, ConfigBody: r.ConfigBody}, Pod: pod}
	if ordinary {
		o.Image = p.src.base.Image
	}
	return o, true
}

// imageOrder completes a snapshot image's order with its container's
// top layer, which containerd knows: the snapshot's parent.
func (l *Launcher) imageOrder(ctx context.Context, r task.LaunchRequest, o PoolOrder) (PoolOrder, error) {
	client, err := l.clients.Get(r.Containerd)
	if err != nil {
		return o, err
	}
	ctx = namespaces.WithNamespace(ctx, r.Namespace)
	c, err := client.ContainerService().Get(ctx, r.ID)
	if err != nil {
		return o, fmt.Errorf("container %s: %w", r.ID, err)
	}
	info, err := client.SnapshotService(c.Snapshotter).Stat(ctx, c.SnapshotKey)
	if err != nil {
		return o, fmt.Errorf("snapshot of container %s: %w", r.ID, err)
	}
	o.Parent, o.Snapshotter = info.Parent, c.Snapshotter
	return o, nil
}

// claim runs r in the launcher's pooled VM when it suits r: nil, and no
// error, when there is none or it does not. Either way the pool is done.
func (l *Launcher) claim(ctx context.Context, cfg config.Config, d hypervisor.Driver, r task.LaunchRequest, p *prepared) (*task.Sandbox, []restore.Phase, error) {
	if l.pool == nil {
		return nil, nil, nil
	}
	o, ok := orderOf(r, p)
	if !ok {
		l.pool.Close()
		return nil, nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Shim.RestoreTimeout.D())
	defer cancel()
	began := time.Now()
	pv := l.pool.take(ctx, o.poolKey, p.plan.Mode, d.Name(), p.staged.Top().ID().String())
	if pv == nil {
		return nil, nil, nil
	}
	sb, phases, err := l.runPooled(ctx, cfg, d, r, p, pv, began)
	if err != nil {
		pv.close(ctx)
		if errors.Is(err, errUnusable) {
			log.G(ctx).WithError(err).Warn("restoring a VM for the task instead")
			return nil, nil, nil
		}
		return nil, nil, fmt.Errorf("claim the pooled VM: %w", err)
	}
	log.G(ctx).WithFields(log.Fields{"id": r.ID, "pid": pv.res.VM.PID(), "pool": pv.id}).Info("task runs in the pooled VM")
	return sb, phases, nil
}

// runPooled gives the pooled VM pv r's image, network, hooks and guest
// setup, as a restore would have.
func (l *Launcher) runPooled(ctx context.Context, cfg config.Config, d hypervisor.Driver, r task.LaunchRequest, p *prepared, pv *pooledVM, began time.Time) (*task.Sandbox, []restore.Phase, error) {
	var phases []restore.Phase
	add := func(name string, took time.Duration) {
		phases = append(phases, restore.Phase{Name: name, Duration: config.Duration(took)})
	}
	if err := pv.claim(ctx); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", errUnusable, err)
	}
	if err := pv.usable(ctx); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", errUnusable, err)
	}
	// A task's cgroup takes the VM as the task's setup begins (loaded);
	// without one, it leaves the pool's.
	if r.Spec == nil || r.Spec.Linux == nil || r.Spec.Linux.CgroupsPath == "" {
		if err := task.JoinOwnCgroups(pv.res.VM.PID()); err != nil {
			return nil, nil, fmt.Errorf("%w: leave the pool's cgroup: %w", errUnusable, err)
		}
	}
	if p.src.disk != nil {
		if err := pv.res.VM.(hypervisor.RootfsAttacher).AttachRootfs(ctx, p.src.disk.ImagePath()); err != nil {
			return nil, nil, fmt.Errorf("%w: %w", errUnusable, err)
		}
	}
	add(PhaseClaim, time.Since(began))
	if err := pv.giveNetwork(p); err != nil {
		return nil, nil, err
	}
	if pv.warmedContainers {
		p.guest.WarmContainers = false
	}
	spawn := task.Spawn{Hypervisor: d.Name(), RunDir: pv.runDir, Plan: p.plan, Memory: p.budget,
		Network: p.net.record(), Base: p.src.record(), PoolBase: pv.base.Record()}
	if err := (loadedDriver{Driver: d, req: r, spawn: spawn, net: p.net}).loaded(ctx, pv.res.VM.PID(), add); err != nil {
		return nil, nil, errors.Join(err, p.net.Release())
	}
	rep, err := restore.Claim(ctx, pv.res.Agent, restore.Request{Plan: p.plan, Hostname: r.Hostname,
		AgentTimeout: cfg.Agent.ConnectTimeout.D(), Guest: p.guest})
	if err != nil {
		return nil, nil, errors.Join(err, p.net.Release())
	}
	// The VM maps the chain's memory file, which the task's own staged
	// chain (its base's, or its image's) links too: the pool's staging is
	// no longer needed.
	base := pv.base
	pv.base = nil
	go func() {
		if err := base.Release(); err != nil {
			log.G(ctx).WithError(err).Warn("release the pooled VM's base snapshot")
		}
	}()
	sb, err := l.sandbox(ctx, cfg, d, r, *p, pv.res, spawn)
	if err != nil {
		return nil, nil, err
	}
	return sb, append(phases, rep.Phases...), nil
}

// giveNetwork makes the pooled VM's NIC the task's: its namespace and tap
// stand for the new one the task's spec asked for (the same: nothing in
// it but the tap); into one the spec names its tap moves, in place of
// the task's own. Either way pv has none left.
func (pv *pooledVM) giveNetwork(p *prepared) error {
	if p.net == nil || p.net.path == "" {
		if err := p.net.Release(); err != nil {
			return fmt.Errorf("release the task's own network: %w", err)
		}
		p.net, pv.net = pv.net, nil
		p.guest.Network = p.net.guest
		return nil
	}
	if err := p.net.adopt(pv.net); err != nil {
		return fmt.Errorf("move the pooled VM's tap into the task's network namespace: %w", err)
	}
	pv.net = nil
	return nil
}
