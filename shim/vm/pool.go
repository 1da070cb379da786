package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/restore"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/baseimage"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/spare"
)

// PoolEnv carries a PoolOrder (JSON) to the spare a task server starts.
const PoolEnv = "COCOON_POOLED_VM"

// poolLease bounds the life of a pooled VM's base snapshot should its
// spare die without releasing it: containerd's collector removes it then.
// A spare waits spare.IdleTimeout (10 minutes) at most.
const poolLease = 15 * time.Minute

// poolWait bounds a launch's wait for the pooled VM still restoring: a
// fill slower than that is stuck, and the launch restores its own.
const poolWait = 5 * time.Second

// PoolOrder is what a spare restores ahead: the chain a task on this
// containerd just restored its VM from, under that task's config — the
// base image of an ordinary image, or a snapshot image's own top layer,
// in Snapshotter.
type PoolOrder struct {
	poolKey
	Image       string `json:"image,omitempty"`
	Parent      string `json:"parent,omitempty"`
	Snapshotter string `json:"snapshotter,omitempty"`
	// Pod: the ordering launch was a pod's VM, so the warm-up covers a
	// pod's path too (shim.warm_runc). Any launch of the key may claim
	// the VM; only the warm-up differs.
	Pod bool `json:"pod,omitempty"`
}

// poolKey is what a launch and a pooled VM must share, besides the chain
// restored (which a launch knows as its staged top link, not by name).
type poolKey struct {
	Containerd string `json:"containerd"`
	Namespace  string `json:"namespace"`
	ConfigPath string `json:"configPath,omitempty"`
	ConfigBody string `json:"configBody,omitempty"`
}

// Env is o as the spare's environment entry.
func (o PoolOrder) Env() string {
	b, _ := json.Marshal(o)
	return PoolEnv + "=" + string(b)
}

// pooledVM is a VM restored from its order's chain, running, its agent
// connected, its guest given no task yet.
type pooledVM struct {
	order  PoolOrder
	id     string
	mode   hypervisor.Mode
	driver string
	top    string // the ID of its chain's top link
	res    *restore.Result
	base   *baseimage.Snapshot
	net    *vmNetwork
	runDir string
	// callTimeout bounds the warm-up's step under way once a claim comes.
	callTimeout time.Duration
	// warmRootfs: the rootfs slot holds the warm-up's empty image.
	warmRootfs bool
	// warmContainers: the warm-up has the guest make and remove a
	// throwaway container (shim.warm_runc, for a pod's VM; with ownInit
	// through its own container init), as a pod VM's restore would; once
	// the guest has begun it, warmedContainers. With joinSerial, the
	// serial of disk slot 0 holding the warm-up's image (joinSize bytes),
	// the container joins as a pod's first would (warmJoin).
	warmContainers, ownInit, warmedContainers bool
	joinSerial                                string
	joinSize                                  uint64
	// warming is held by each step of the warm-up; claimed ends it, and
	// cut says the claim's deadline ended the step under way.
	warming      sync.Mutex
	claimed, cut bool
	// claiming is closed as a claim begins.
	claiming chan struct{}
}

// Pool holds the VM a spare restored ahead for the first task it serves
// (shim.pooled_vm): that task claims it, or it is closed. Its methods are
// safe on a nil Pool, which holds nothing.
type Pool struct {
	order PoolOrder
	// restoring is closed once the fill has staged the chain and begun
	// the restore, ready once it has a VM or has failed; cancel ends it.
	restoring, ready chan struct{}
	cancel           context.CancelFunc

	mu    sync.Mutex
	vm    *pooledVM
	taken bool // claimed or closed: a VM the fill ends with is closed
	// failed is why the fill ended with no VM: a spare logs nothing
	// before its task, whose log then tells it.
	failed error
}

// FillPool starts restoring the VM the order in the environment asks for,
// if any, for l's first launch to claim; a spare calls it while it waits
// for its task.
func (l *Launcher) FillPool() {
	v := os.Getenv(PoolEnv)
	if v == "" {
		return
	}
	var o PoolOrder
	if err := json.Unmarshal([]byte(v), &o); err != nil || (o.Image == "") == (o.Parent == "") {
		log.L.WithError(err).Warn("a pooled VM's order in the environment is not one: none restored")
		return
	}
	ctx, cancel := context.WithCancel(log.WithLogger(context.Background(), log.L.WithField("pool", o.Image+o.Parent)))
	l.pool = &Pool{order: o, restoring: make(chan struct{}), ready: make(chan struct{}), cancel: cancel}
	go l.pool.fill(ctx, o, l)
}

// ClosePool closes the VM FillPool restored if no launch took it.
func (l *Launcher) ClosePool() { l.pool.Close() }

// fill restores the order's VM and offers it at once; it then warms it
// while no task has claimed it.
func (p *Pool) fill(ctx context.Context, o PoolOrder, l *Launcher) {
	defer p.cancel()
	pv, err := restoreAhead(ctx, o, l, sync.OnceFunc(func() { close(p.restoring) }))
	if err != nil {
		if ctx.Err() == nil { // else a launch came first and cancelled it
			p.fail(fmt.Errorf("restore a VM ahead for the next task: %w", err))
		}
		close(p.ready)
		return
	}
	p.mu.Lock()
	taken := p.taken
	if !taken {
		p.vm = pv
	}
	p.mu.Unlock()
	close(p.ready)
	if taken { // the task came, did not suit and did not wait
		pv.close(ctx)
		return
	}
	if err := pv.warm(ctx); err != nil {
		p.mu.Lock()
		unclaimed := p.vm == pv
		if unclaimed {
			p.vm = nil
		}
		p.mu.Unlock()
		// A VM a launch took and closed (not its kind) ends its warm-up
		// with an error that is no news.
		if unclaimed {
			p.fail(fmt.Errorf("warm the pooled VM: closed: %w", err))
			pv.close(ctx)
		}
	}
}

// fail records why the fill has no VM, for the task's log.
func (p *Pool) fail(err error) {
	p.mu.Lock()
	p.failed = err
	p.mu.Unlock()
}

// restoreAhead, in its turn (lockFills), stages o's chain under a lease
// of its own and restores it with its rootfs slot empty and a NIC in a
// namespace of its own (telling restoring as it begins), and connects the
// agent without giving the guest a task.
func restoreAhead(ctx context.Context, o PoolOrder, l *Launcher, restoring func()) (*pooledVM, error) {
	cfg, err := config.LoadTask(o.ConfigPath, o.ConfigBody)
	if err != nil {
		return nil, fmt.Errorf("load config: %w", err)
	}
	d, err := l.driver(cfg)
	if err != nil {
		return nil, err
	}
	parent := filepath.Join(cfg.Shim.RunDir, o.Namespace)
	if err := os.MkdirAll(parent, 0o711); err != nil {
		return nil, fmt.Errorf("create run dir parent: %w", err)
	}
	sweepPools(ctx, parent)
	unlock, err := lockFills(ctx, parent, cfg.Shim.RunDir)
	if err != nil {
		return nil, err
	}
	pv, err := stageAhead(ctx, o, l, cfg, d, parent)
	if err != nil {
		unlock()
		return nil, err
	}
	restoring()
	ctx, cancel := context.WithTimeout(ctx, cfg.Shim.RestoreTimeout.D())
	defer cancel()
	cg, err := poolCgroup(cfg)
	if err == nil {
		err = pv.restore(ctx, cfg, d, cg)
	}
	unlock()
	if err != nil {
		return nil, errors.Join(err, pv.net.Release(), pv.base.Release())
	}
	if _, ok := pv.res.VM.(hypervisor.RootfsAttacher); !ok && o.Image != "" {
		pv.close(ctx)
		return nil, fmt.Errorf("%s cannot give a running VM its rootfs, which a pooled VM of a base needs", d.Name())
	}
	// Waiting and warming, the VM takes only CPU time nothing else wants;
	// the claim gives it the normal policy back.
	if err := spare.SetPolicy(pv.res.VM.PID(), unix.SCHED_IDLE); err != nil {
		log.G(ctx).WithError(err).Warn("the pooled VM's hypervisor keeps the normal scheduling policy")
	}
	pv.callTimeout = cfg.Agent.CallTimeout.D()
	pv.warmContainers, pv.ownInit = o.Pod && cfg.Shim.WarmRunc, cfg.Shim.OwnInit
	if o.Image == "" {
		return pv, nil // a snapshot image's root is its guest's
	}
	if err := pv.attachWarmRootfs(ctx); err != nil {
		log.G(ctx).WithError(err).Info("the pooled VM's warm-up mounts no root")
	} else {
		pv.warmRootfs = true
	}
	return pv, nil
}

// stageAhead stages o's chain for a pooled VM run in parent, under a
// lease that expires should the spare die holding it.
func stageAhead(ctx context.Context, o PoolOrder, l *Launcher, cfg config.Config, d hypervisor.Driver, parent string) (*pooledVM, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.Shim.RestoreTimeout.D())
	defer cancel()
	client, err := l.clients.Get(o.Containerd)
	if err != nil {
		return nil, err
	}
	sweepPoolLeases(ctx, client, o.Namespace)
	pv := &pooledVM{order: o, id: spare.PoolPrefix + strconv.Itoa(os.Getpid()), driver: d.Name(), claiming: make(chan struct{})}
	pv.runDir = filepath.Join(parent, pv.id)
	expiring := leases.WithExpiration(poolLease)
	if o.Image != "" {
		pv.base, err = baseimage.Stage(ctx, client, o.Namespace, cfg.Restore.BaseSnapshotter, o.Image, pv.id, expiring)
	} else {
		pv.base, err = baseimage.StageParent(ctx, client, o.Namespace, o.Snapshotter, o.Parent, pv.id, expiring)
	}
	if err != nil {
		return nil, err
	}
	return pv, nil
}

// restore restores pv's chain, deferred, in the pool's cgroup cg, its NIC
// on a tap in a new namespace (a task whose spec asks for a new one takes
// both).
func (pv *pooledVM) restore(ctx context.Context, cfg config.Config, d hypervisor.Driver, cg hypervisor.Cgroup) error {
	plan, _, err := restore.PlanFor(ctx, d, cfg.Restore, pv.base.Staged.Top(), pv.base.Staged, nil)
	if err != nil {
		return err
	}
	pv.mode, pv.top = plan.Mode, pv.base.Staged.Top().ID().String()
	newNS := &specs.Spec{Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.NetworkNamespace}}}}
	if pv.net, err = openNetwork(newNS, pv.id); err != nil {
		return err
	}
	netns, nic := pv.net.attach()
	pv.res, err = restore.Run(ctx, inCgroup{Driver: d, cg: cg}, restore.Request{
		StagedDir: pv.base.Dir, Staged: pv.base.Staged, RunDir: pv.runDir, Plan: plan,
		AgentTimeout: cfg.Agent.ConnectTimeout.D(), NetNS: netns, NIC: nic, Deferred: true,
	})
	pv.net.closeTap()
	return err
}

// take hands the pooled VM to a launch that matches its order, mode,
// driver and chain; nil when there is none or it does not match. A launch
// of the order waits for a fill that is restoring (poolWait at most, until
// ctx ends): it is further on than a restore begun now. Any other fill (of
// another order, or not restoring yet: the spare was still starting, or
// staging) is cancelled, so it takes no CPU from the launch's own restore. Either way the pool is
// done: a VM it does not hand over is closed, now or once its fill ends.
func (p *Pool) take(ctx context.Context, o poolKey, mode hypervisor.Mode, driver string, top string) *pooledVM {
	if p == nil {
		return nil
	}
	if p.order.poolKey == o && p.isRestoring() {
		wait := time.NewTimer(poolWait)
		select {
		case <-p.ready:
		case <-wait.C:
		case <-ctx.Done():
		}
		wait.Stop()
	} else {
		p.cancel()
	}
	p.mu.Lock()
	pv, failed := p.vm, p.failed
	p.vm, p.taken = nil, true
	p.mu.Unlock()
	if failed != nil {
		log.G(ctx).WithError(failed).Warn("the spare has no pooled VM")
	}
	if pv == nil {
		return nil
	}
	if pv.order.poolKey != o || pv.mode != mode || pv.driver != driver || pv.top != top {
		log.G(ctx).WithFields(log.Fields{"pooled": pv.order, "mode": pv.mode}).Info("the pooled VM does not suit the task: closed")
		pv.close(ctx)
		return nil
	}
	return pv
}

// lockFills waits, until ctx ends, for a fill's turn, and returns the
// unlock. The fills of dir's pooled VMs stage and restore one at a time
// (a flock on dir): spares refilled after a burst restore in turn, not
// all at once against the next burst's tasks, which cancel the fills not
// restoring yet (Pool.take) and restore their own. And none begins while
// a launch is under way in runDir (awaitLaunches). The warm-ups, at idle
// priority, overlap.
func lockFills(ctx context.Context, dir, runDir string) (func(), error) {
	unlock, err := pollFlock(ctx, dir)
	if err != nil {
		return nil, err
	}
	if err := awaitLaunches(ctx, runDir); err != nil {
		unlock()
		return nil, err
	}
	return unlock, nil
}

func (p *Pool) isRestoring() bool {
	select {
	case <-p.restoring:
		return true
	default:
		return false
	}
}

// Close closes a pooled VM no task took.
func (p *Pool) Close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	pv := p.vm
	p.vm, p.taken = nil, true
	p.mu.Unlock()
	if pv != nil {
		pv.close(context.Background())
	}
}

// close kills the pooled VM and lets go of its network and base.
func (pv *pooledVM) close(ctx context.Context) {
	err := errors.Join(pv.res.Agent.Close(), pv.res.VM.Close(), pv.net.Release(), pv.base.Release())
	if err != nil {
		log.G(ctx).WithError(err).Warn("close the pooled VM")
	}
}
