package vm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/docker/go-units"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
)

// The phases of a container joining its pod's VM: its image's disk
// attached to a spare slot, then the container created in the guest: the
// guest's own steps (restore.GuestPhasePrefix and api.CreatePhases'
// names), and PhaseContainer the rest of the call.
const (
	PhaseAttach    = "attach"
	PhaseContainer = "container"
)

// PodVM says whether r, a pod sandbox, gets the VM its pod's containers
// join: its config's shim.pod_vm.
func (l *Launcher) PodVM(r task.LaunchRequest) (bool, error) {
	cfg, err := config.LoadTask(r.ConfigPath, r.ConfigBody)
	if err != nil {
		return false, fmt.Errorf("load config: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	if cfg.Shim.PodVM != config.PodVMPod {
		return false, nil
	}
	if r.Rootfs == nil {
		return false, fmt.Errorf("pod sandbox %s: with shim.pod_vm = %q its image is the root of the pod's VM and must be an ordinary image the cocoon snapshotter unpacked (the handler's snapshotter = \"cocoon\"): %w",
			r.ID, config.PodVMPod, errdefs.ErrInvalidArgument)
	}
	return true, nil
}

// pod is a pod's running VM as the pod's containers join it: each gets a
// spare disk slot for its image and a container in the guest.
type pod struct {
	agent       *agent.Client
	disks       hypervisor.DiskAttacher
	pid         int
	memory      int64 // the guest's RAM, which the containers' limits share
	callTimeout time.Duration
	ownInit     bool // the guest's own container init makes the containers

	dirs   *sharedDirs // the copies of directories the containers bind
	copies *copyBudget // bounds all the copies the VM holds

	mu    sync.Mutex
	slots []string // the container holding each slot, "" when free
	// pidHolder is the guest pid of the container whose PID namespace the
	// pod's containers share (shareProcessNamespace), 0 before one runs.
	pidHolder uint32
}

var _ task.Host = (*pod)(nil)

// newPod makes the VM of a pod sandbox a host for the pod's containers;
// its snapshot must have spare disk slots for their images.
func newPod(res hypervisorVM, c *agent.Client, memory int64, callTimeout time.Duration, copies *copyBudget) (*pod, error) {
	disks, ok := res.(hypervisor.DiskAttacher)
	if !ok || disks.DiskSlots() == 0 {
		return nil, fmt.Errorf("a pod's VM (shim.pod_vm = %q, or containerd's sandbox API) needs spare disk slots for the pod's containers, and the base snapshot has none: bake it with cocoonctl bake --disk-slots N: %w",
			config.PodVMPod, errdefs.ErrFailedPrecondition)
	}
	return &pod{agent: c, disks: disks, pid: res.PID(), memory: memory, callTimeout: callTimeout, copies: copies,
		dirs: newSharedDirs(podBindSources, newLiveVolumes(c, callTimeout, copies)), slots: make([]string, disks.DiskSlots())}, nil
}

// hypervisorVM is the part of hypervisor.VM a pod needs.
type hypervisorVM interface{ PID() int }

// Join creates r's container in the VM: its image's erofs on a spare
// slot, the spec's bind sources copied in, its process held until Start.
func (p *pod) Join(ctx context.Context, r task.LaunchRequest) (_ *task.Sandbox, retErr error) {
	clock := newPhaseClock()
	if r.Rootfs == nil {
		return nil, fmt.Errorf("container %s runs a snapshot image, which restores a VM of its own: in a pod whose VM its containers join (shim.pod_vm = %q) every container runs an ordinary image: %w",
			r.ID, config.PodVMPod, errdefs.ErrInvalidArgument)
	}
	if err := p.checkMemory(r.ID, resourcesOf(r.Spec)); err != nil {
		return nil, err
	}
	g, err := p.guestSpec(r)
	if err != nil {
		return nil, err
	}
	if err := p.copies.take(g.copies.all); err != nil {
		return nil, fmt.Errorf("container %s: %w", r.ID, err)
	}
	slot, err := p.claim(r.ID)
	if err != nil {
		p.copies.give(g.copies.all)
		return nil, err
	}
	m := &member{pod: p, id: r.ID, slot: slot, spec: g.spec, copies: g.copies, gone: make(chan struct{}), execs: map[string]*agent.ContainerProcess{}}
	defer func() {
		if retErr != nil {
			m.release(ctx)
		}
	}()
	serial, err := p.disks.AttachDisk(ctx, slot, r.Rootfs.ImagePath())
	if err != nil {
		return nil, fmt.Errorf("attach the image of container %s: %w", r.ID, err)
	}
	volumes, err := p.attachVolumes(ctx, m, g.images)
	if err != nil {
		return nil, err
	}
	if p.dirs.shares != nil {
		if err := p.dirs.shares.open(ctx, p.agent, g.shares); err != nil {
			return nil, fmt.Errorf("container %s: %w", r.ID, err)
		}
	}
	clock.lap(PhaseAttach)
	if r.Created != nil {
		if err := r.Created(ctx, p.pid); err != nil {
			return nil, fmt.Errorf("createRuntime hooks: %w", err)
		}
		clock.lap(PhaseHooks)
	}
	root := agent.ContainerRoot{Disk: &agent.Rootfs{FSType: r.Rootfs.FSType, Serial: serial, Size: r.Rootfs.ImageSize()}, Files: g.files, Volumes: volumes, OwnInit: p.ownInit}
	if m.init, err = p.agent.CreateContainerFrom(ctx, r.ID, g.spec, root, r.Process != nil && r.Process.Stdin); err != nil {
		return nil, err
	}
	m.created = true
	p.dirs.keep(ctx, g.copied, g.files)
	clock.lapWithin(PhaseContainer, m.init.Phases)
	if g.sharedPID {
		p.holdPIDs(m.init.Pid)
	}
	return &task.Sandbox{
		VM: memberVM{m}, Guest: memberGuest{m}, Container: m,
		Hypervisor: task.PodMember,
		Plan:       state.Plan{Mode: "join", Reasons: []string{fmt.Sprintf("a container of a pod whose VM runs: joined it, its image on disk slot %d", slot)}},
		Memory:     task.MemoryBudget{Guest: p.memory},
		Phases:     clock.phases,
	}, nil
}

// checkMemory fails when the container's memory limit cannot fit the VM.
func (p *pod) checkMemory(id string, res *specs.LinuxResources) error {
	if res == nil || res.Memory == nil || res.Memory.Limit == nil || *res.Memory.Limit <= p.memory {
		return nil
	}
	return fmt.Errorf("container %s: memory limit %s is above its pod VM's memory %s: lower the limit or use a base snapshot with more memory: %w",
		id, units.BytesSize(float64(*res.Memory.Limit)), units.BytesSize(float64(p.memory)), errdefs.ErrInvalidArgument)
}

// claim takes a free disk slot for container id.
func (p *pod) claim(id string) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, holder := range p.slots {
		if holder == "" {
			p.slots[i] = id
			return i, nil
		}
	}
	return 0, fmt.Errorf("container %s: all %d disk slots of the pod's VM hold containers (bake the base snapshot with more --disk-slots): %w",
		id, len(p.slots), errdefs.ErrResourceExhausted)
}

func (p *pod) free(slot int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.slots[slot] = ""
}

// bounded bounds a call that answers at once by the agent's call timeout.
func (p *pod) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, p.callTimeout)
}

// guestContainer is a container as the guest takes it: the spec its runc
// runs, the copies of bind sources to write first, the directories among
// them the pod keeps (by host path), and whether it shares the pod's PID
// namespace.
type guestContainer struct {
	spec      *specs.Spec
	files     []agent.File
	copied    map[string]string
	copies    memberCopies
	images    []imageVolume
	shares    map[shareKey]*dirShare
	sharedPID bool
}

// guestSpec is r's container as the guest takes it. Its bind sources that
// are files are copied under a directory of its own; directories are the
// pod's (sharedDirs).
func (p *pod) guestSpec(r task.LaunchRequest) (guestContainer, error) {
	spec := *r.Spec
	b := binds{dir: memberBindSources(r.ID), pod: p.dirs, budget: p.copies, vm: p.dirs.shares}
	spec.Mounts = nil
	for _, m := range r.Spec.Mounts {
		gm, err := b.translate(m)
		if err != nil {
			return guestContainer{}, fmt.Errorf("container %s: mount at %s: %w", r.ID, m.Destination, err)
		}
		spec.Mounts = append(spec.Mounts, gm...)
	}
	// Hooks run on the host, by the shim; the guest has no host binaries.
	spec.Hooks = nil
	g := guestContainer{spec: &spec, files: b.files, copied: b.copied, images: b.images, shares: b.shares,
		copies: memberCopies{all: b.used, own: usageOf(b.files, b.dir), paths: []string{b.dir}}}
	for _, c := range b.copied {
		g.copies.paths = append(g.copies.paths, c)
	}
	if spec.Linux != nil {
		linux := *spec.Linux
		linux.Namespaces, g.sharedPID = p.guestNamespaces(linux.Namespaces)
		spec.Linux = &linux
	}
	return g, nil
}

// guestNamespaces maps the host's namespace paths, which CRI gives to
// share the pod's, to the guest's: the VM's own network, IPC and UTS are
// the pod's, and a shared PID namespace is the pod's pause's (pauseGuest),
// or without one (containerd's sandbox API) that of the first container
// that shared it (sharedPID says the spec asks to share it).
func (p *pod) guestNamespaces(in []specs.LinuxNamespace) (out []specs.LinuxNamespace, sharedPID bool) {
	p.mu.Lock()
	holder := p.pidHolder
	p.mu.Unlock()
	out = make([]specs.LinuxNamespace, 0, len(in))
	for _, ns := range in {
		switch {
		case ns.Type == specs.NetworkNamespace:
			continue
		case ns.Path == "":
		case ns.Type == specs.PIDNamespace:
			sharedPID, ns.Path = true, ""
			if holder != 0 {
				ns.Path = fmt.Sprintf("/proc/%d/ns/pid", holder)
			}
		default:
			continue
		}
		out = append(out, ns)
	}
	return out, sharedPID
}

// holdPIDs makes the container whose guest pid is pid hold the pod's
// shared PID namespace, if none does.
func (p *pod) holdPIDs(pid uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pidHolder == 0 {
		p.pidHolder = pid
	}
}

// unholdPIDs forgets a holder that is gone.
func (p *pod) unholdPIDs(pid uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pidHolder == pid {
		p.pidHolder = 0
	}
}

func logRelease(ctx context.Context, id string, err error) {
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		log.G(ctx).WithError(err).WithField("id", id).Warn("release container of a pod VM")
	}
}
