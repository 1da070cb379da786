package task

import (
	"context"
	"io"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
)

// ProcessSpec is a process to run in the guest, as the agent takes it; its
// ID names it to the agent and is unique within the VM.
type ProcessSpec = agent.ExecRequest

// Exit is how a process ended.
type Exit struct {
	Status uint32
	At     time.Time
	// OOMKilled says the OOM killer ended it in its container's cgroup.
	OOMKilled bool
}

// GuestProcess is one process running in the guest.
type GuestProcess struct {
	Pid uint32
	// ID is the agent's name for it when the shim started it, else empty.
	ID string
}

// Guest is the agent inside a task's VM, as the service uses it. Calls
// that answer at once (all but Wait and the stdio streams) are bounded by
// the implementation's configured call timeout (agent.call_timeout), the
// one owner of that deadline: callers pass their context only.
type Guest interface {
	// Exec starts p. A p the launch prepared (LaunchRequest.Process) only
	// starts.
	Exec(ctx context.Context, p ProcessSpec) (Started, error)
	Wait(ctx context.Context, id string) (Exit, error)
	Signal(ctx context.Context, id string, sig syscall.Signal) error
	ResizePty(ctx context.Context, id string, width, height uint32) error
	CloseStdin(ctx context.Context, id string) error
	// Delete forgets an exited process.
	Delete(ctx context.Context, id string) error
	Processes(ctx context.Context) ([]GuestProcess, error)
	Close() error
}

// Started is a process the guest started.
type Started struct {
	Pid uint32 // 0 if the agent does not report pids
	Streams
}

// Streams are a started process's stdio from the guest: Stdin is nil
// unless the process has one; with a terminal, Stdout carries the pty and
// Stderr is nil.
type Streams struct {
	Stdin          io.WriteCloser
	Stdout, Stderr io.ReadCloser
}

// VM is the hypervisor process behind a task. hypervisor.VM satisfies it;
// checkpointing additionally needs hypervisor.Checkpointer.
type VM interface {
	PID() int
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
	Shutdown(ctx context.Context) error
	Kill() error
	Wait(ctx context.Context) error
	Close() error
}

// Sandbox is a restored, running VM with its guest agent connected.
type Sandbox struct {
	VM         VM
	Guest      Guest
	Hypervisor string
	RunDir     string
	Plan       state.Plan
	Phases     []state.Phase
	Memory     MemoryBudget
	// Network, when set, is released when the init process exits (so the
	// next container of a pod can take the pod's interface) and at delete.
	Network Releaser
	// NetworkRecord names it in the task record.
	NetworkRecord *state.Network
	// Base, when set, is released once the VM is gone.
	Base Releaser
	// BaseRecord names it in the task record.
	BaseRecord *state.Base
	// Host, when set, runs the pod's other containers in this VM: the
	// VM of a pod's sandbox (shim.pod_vm = "pod").
	Host Host
	// Container, when set, says this is a container that joined its
	// pod's VM: VM and Guest are that container's, and its cgroup is
	// the guest's, not the host's.
	Container Container
	// SpareEnv, when set, is what the spares started after this launch
	// get in their environment ("KEY=VALUE", replacing the server's): the
	// order of a VM to restore ahead for the next task, or its clearing.
	// It is asked off the task's path (it may ask containerd).
	SpareEnv func(context.Context) []string
	// Spares is how many spares should wait for the next tasks
	// (shim.spares); one when unset.
	Spares int
}

// Host is a running VM that containers of its pod join.
type Host interface {
	// Join creates r's container in the VM, its process held until
	// Start, and returns it as a Sandbox whose Container is set. It
	// runs r.Created with the VM's pid before the container exists.
	Join(ctx context.Context, r LaunchRequest) (*Sandbox, error)
}

// Container is a container in its pod's VM, whose resources live in the
// guest.
type Container interface {
	// Stats reads the container's cgroup in the guest (cgroup v2 types).
	Stats(ctx context.Context) (any, error)
	// Update sets the container's resources in the guest.
	Update(ctx context.Context, res *specs.LinuxResources) error
}

// Releaser lets go of something a VM holds; Release is idempotent.
type Releaser interface {
	Release() error
}

// Spawn is a VM whose hypervisor process exists but whose guest is not up
// yet: what the task record needs.
type Spawn struct {
	PID        int
	Hypervisor string
	RunDir     string
	Plan       state.Plan
	Memory     MemoryBudget
	Network    *state.Network
	Base       *state.Base
	PoolBase   *state.Base
}

func spawnOf(sb *Sandbox) Spawn {
	return Spawn{PID: sb.VM.PID(), Hypervisor: sb.Hypervisor, RunDir: sb.RunDir, Plan: sb.Plan,
		Memory: sb.Memory, Network: sb.NetworkRecord, Base: sb.BaseRecord}
}

// LaunchRequest is what a Launcher restores a task's VM from.
type LaunchRequest struct {
	ID        string
	Namespace string
	Bundle    string
	Spec      *specs.Spec
	// StagedDir is the snapshotter's staged chain of a snapshot image; ""
	// when the task's image is an ordinary one (Rootfs).
	StagedDir string
	// Rootfs is the filesystem image of an ordinary image's layers, which
	// the VM of the runtime class's base snapshot mounts as its root.
	Rootfs *chain.StagedRootfs
	// Bare restores the runtime class's base snapshot with no image as
	// its root and no process: a pod's VM under containerd's sandbox API
	// (sandboxer = "shim"), whose containers each bring their own image.
	Bare bool
	// Containerd is containerd's gRPC address, for staging a base image.
	Containerd string
	// ConfigPath is the runtime options' config file, if any; ConfigBody
	// their inline config, if any (never both).
	ConfigPath string
	ConfigBody string
	Hostname   string
	// Sysctls are set in the guest, whose namespaces are the pod's (the
	// agent's Init): its pod's and its spec's linux.sysctl.
	Sysctls map[string]string
	// Process is the task's init process: a launcher that can prepares it
	// in the guest as the VM comes up, so that Start only lets it run (the
	// Guest's Exec of it then starts what was prepared); nil prepares
	// nothing.
	Process *ProcessSpec
	// Starting, when set, is called before the launcher creates anything
	// for the VM (base snapshot, tap, run dir, hypervisor process), with
	// the names of all it may create: all of Spawn but the pid and plan.
	// The service records them, so `shim delete` can clean up after a shim
	// that dies before Spawned. An error fails the launch.
	Starting func(Spawn) error
	// Spawned, when set, is called once the hypervisor process exists,
	// before the guest is brought up, so the service can record the VM
	// and place it in its cgroup meanwhile. It does not block. Launch
	// calls it at most once, and before it returns.
	Spawned func(Spawn)
	// Cgroup, when set, is the task's cgroup, made by Starting: the
	// launcher's driver charges the guest's memory to it and starts the
	// hypervisor in it (hypervisor.RestoreRequest.Cgroup).
	Cgroup hypervisor.Cgroup
	// Created, when set, is called with the hypervisor's pid once the VM
	// exists and is loaded but before its guest runs (for a sandbox, once
	// its pause process runs): the service runs the OCI createRuntime
	// hooks there, which may set up the namespace's network. An error
	// fails the launch. Launch calls it at most once.
	Created func(ctx context.Context, pid int) error
}

// Launcher restores the VM of a new task. On error nothing it started is
// left running.
type Launcher interface {
	Launch(ctx context.Context, r LaunchRequest) (*Sandbox, error)
}

// Warmer is a Launcher that can get ready for launches before the first
// one arrives (probe its hypervisor); the service asks it to once, as it
// starts. Warm does not block.
type Warmer interface {
	Warm(ctx context.Context)
}

// Settler is a Launcher with work of its own still under way after a
// launch (the spare servers it starts for the next tasks); the service
// waits for it as the server shuts down, so the exit that follows the
// last task's delete cuts none of it short. Settle returns when that work
// is done or ctx ends.
type Settler interface {
	Settle(ctx context.Context)
}

// CRI's annotations that tell a pod's sandbox container from its app
// containers (containerd's internal/cri/annotations, which other runtimes
// read by these names too).
const (
	containerTypeAnnotation = "io.kubernetes.cri.container-type"
	containerTypeSandbox    = "sandbox"
	sandboxNameAnnotation   = "io.kubernetes.cri.sandbox-name"
)

// IsPodSandbox reports whether spec is a CRI pod sandbox's container.
func IsPodSandbox(spec *specs.Spec) bool {
	return spec != nil && spec.Annotations[containerTypeAnnotation] == containerTypeSandbox
}

// IsCRIPause reports whether spec is a pod sandbox containerd's CRI made
// (it names the pod, as only the CRI does): its process is always its
// configured pause image's, which waits for a signal. A client that marks
// a container a sandbox by its type alone runs what it asks.
func IsCRIPause(spec *specs.Spec) bool {
	return IsPodSandbox(spec) && spec.Annotations[sandboxNameAnnotation] != ""
}

// ownsPIDNamespace reports whether spec asks for a PID namespace of its
// own (an entry without a path), as a pod's sandbox does unless the pod
// shares the host's.
func ownsPIDNamespace(spec *specs.Spec) bool {
	if spec.Linux == nil {
		return false
	}
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.PIDNamespace {
			return ns.Path == ""
		}
	}
	return false
}

// sandboxIDAnnotation names, on each container of a CRI pod, the pod's
// sandbox.
const sandboxIDAnnotation = "io.kubernetes.cri.sandbox-id"

// PodVMChooser is a Launcher that says whether a pod sandbox's task gets
// the VM its pod's containers join (its config's shim.pod_vm).
type PodVMChooser interface {
	PodVM(r LaunchRequest) (bool, error)
}

// PodLauncher launches every task with VM, except the pod sandboxes that
// get no VM (shim.pod_vm = "container"), which it launches with Sandbox.
// A bare pod VM (the sandbox API's) is always VM's.
type PodLauncher struct {
	VM, Sandbox Launcher
}

// Launch picks the launcher for r.
func (l PodLauncher) Launch(ctx context.Context, r LaunchRequest) (*Sandbox, error) {
	if r.Bare || !IsPodSandbox(r.Spec) {
		return l.VM.Launch(ctx, r)
	}
	if c, ok := l.VM.(PodVMChooser); ok {
		podVM, err := c.PodVM(r)
		if err != nil {
			return nil, err
		}
		if podVM {
			return l.VM.Launch(ctx, r)
		}
	}
	return l.Sandbox.Launch(ctx, r)
}

// Warm warms the VM launcher, if it can be.
func (l PodLauncher) Warm(ctx context.Context) {
	if w, ok := l.VM.(Warmer); ok {
		w.Warm(ctx)
	}
}
