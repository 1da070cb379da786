// Package hypervisor defines the one small interface every VMM driver implements.
//
// A driver restores a VM, paused, from a chain the snapshotter staged; the
// returned VM is then resumed, paused, snapshotted and stopped through it.
// Optional abilities are small interfaces of their own, checked at compile
// time by each driver (var _ hypervisor.Checkpointer = (*vm)(nil)).
package hypervisor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// The hypervisors cocoon drives, named as chain links and config.toml name them.
const (
	QEMU            = "qemu"
	CloudHypervisor = "cloud-hypervisor"
	Firecracker     = "firecracker"
)

// Names lists every hypervisor name.
var Names = []string{QEMU, CloudHypervisor, Firecracker}

// Mode is how guest memory is brought back on restore.
type Mode string

const (
	// ModeCopy loads all memory into private memory before resume. Once
	// Restore returns, the VM no longer reads the staged memory file: the
	// caller may unlink it (restore.Run does, once the guest is up).
	ModeCopy Mode = "copy"
	// ModeOnDemand faults pages in lazily from the file (userfaultfd).
	ModeOnDemand Mode = "ondemand"
	// ModeMmap maps the staged memory file privately (copy-on-write).
	ModeMmap Mode = "mmap"
)

// ModeAuto asks for the best mode a hypervisor supports. It is a request
// (config, annotation), never a plan's mode.
const ModeAuto Mode = "auto"

// Modes lists every mode, best first.
var Modes = []Mode{ModeMmap, ModeOnDemand, ModeCopy}

// ParseMode is the one parser of mode names: exactly one of Modes, or
// ModeAuto when auto is allowed; anything else is an error naming the bad
// value and the valid ones.
func ParseMode(s string, auto bool) (Mode, error) {
	if auto && s == string(ModeAuto) {
		return ModeAuto, nil
	}
	for _, m := range Modes {
		if string(m) == s {
			return m, nil
		}
	}
	valid := JoinModes(Modes)
	if auto {
		valid = string(ModeAuto) + ", " + valid
	}
	return "", fmt.Errorf("unknown restore mode %q: want one of %s", s, valid)
}

// JoinModes lists modes for a message: "mmap, ondemand, copy".
func JoinModes(ms []Mode) string {
	s := make([]string, len(ms))
	for i, m := range ms {
		s[i] = string(m)
	}
	return strings.Join(s, ", ")
}

// SnapshotKind is the kind of chain link a snapshot writes.
type SnapshotKind string

const (
	SnapshotFull SnapshotKind = "full"
	SnapshotDiff SnapshotKind = "diff"
)

// Capabilities are what a driver (and, where probed, its binary) can do.
type Capabilities struct {
	// RestoreModes the driver supports, best first.
	RestoreModes []Mode
	// SnapshotKinds the driver can write.
	SnapshotKinds []SnapshotKind
	// Build identifies the hypervisor binary the capabilities were probed on.
	Build string
}

// Supports reports whether m is one of the driver's restore modes.
func (c Capabilities) Supports(m Mode) bool {
	for _, x := range c.RestoreModes {
		if x == m {
			return true
		}
	}
	return false
}

// RestoreRequest says what to restore and where the VM may keep its files.
type RestoreRequest struct {
	// StagedDir is the snapshotter's staged directory: memory (a hard link
	// of the chain's flat file), private copies of the state files, chain.json.
	// The driver never removes its memory: a failed restore must leave it
	// for a retry, and only the caller knows when the restore has succeeded.
	StagedDir string
	// Staged, if set, is StagedDir's chain as the caller read it (the
	// policy decides on it), so the driver does not read it again.
	Staged *chain.Staged
	// RunDir is private to this VM: sockets, logs, patched configs. The
	// driver creates it and removes it when the VM is closed or fails.
	RunDir string
	// Mode is the restore mode the policy chose.
	Mode Mode
	// OnPhase, if set, is told how long each restore phase took.
	OnPhase func(phase string, d time.Duration)
	// NetNS, if set, is the network namespace (an open nsfs file, e.g. /proc/PID/ns/net or
	// /run/netns/X) the hypervisor process runs in; nil keeps the caller's namespace, or,
	// for a hypervisor that would make a tap of its own for a NIC without one, gives it an
	// empty namespace of its own, so nothing lands on the host.
	NetNS *os.File
	// NIC, if set, backs the snapshot's network device with a tap in NetNS; nil leaves the
	// device without a backend (the guest keeps its NIC down).
	NIC *NIC
	// Disk, if set, is a read-only filesystem image backing the snapshot's rootfs block
	// slot; "" leaves the slot empty.
	Disk string
	// Cgroup, if set, is the VM's cgroup: the driver makes the guest's
	// memory in Charge and starts the hypervisor through Start. Nil leaves
	// both in the caller's cgroup.
	Cgroup Cgroup
	// Attached ties the hypervisor to the caller: it gets SIGKILL when the
	// OS thread that started it ends, the caller's process dying included.
	// For a VM no task record names (a pooled VM), which nothing would
	// kill after its owner's crash; a task's VM outlives its shim.
	Attached bool
}

// RootfsSerial is the serial of every snapshot's rootfs block slot: the
// guest agent finds the disk RestoreRequest.Disk backs by it.
const RootfsSerial = "cocoon-rootfs"

// NIC is a tap device in the VM's network namespace. The tap is persistent (created with
// TUNSETPERSIST, IFF_TAP|IFF_NO_PI, no vnet header) and owned by the caller, who deletes it.
type NIC struct {
	// TapName names the tap in NetNS, for VMMs that open it themselves.
	TapName string
	// TapFile is an open queue of the tap, for VMMs that take an fd (QEMU). The driver hands
	// it to the VMM; the caller closes its own copy after Restore returns. Drivers of VMMs
	// that open the tap by name close it first instead: a single-queue tap takes one queue,
	// so the VMM's open fails with EBUSY while it is open (the caller's Close then returns
	// os.ErrClosed).
	TapFile *os.File
}

// OpenStaged returns the staged chain, read once: r.Staged, else what
// StagedDir holds; it fails unless the chain restores on hypervisor name.
func (r RestoreRequest) OpenStaged(name string) (*chain.Staged, error) {
	s := r.Staged
	if s == nil {
		var err error
		if s, err = chain.OpenStaged(r.StagedDir); err != nil {
			return nil, fmt.Errorf("open staged chain: %w", err)
		}
	}
	if err := s.Top().RestoresOn(name); err != nil {
		return nil, fmt.Errorf("staged chain in %s: %w", r.StagedDir, err)
	}
	return s, nil
}

// Phase reports d for phase to r.OnPhase, if set.
func (r RestoreRequest) Phase(phase string, d time.Duration) {
	if r.OnPhase != nil {
		r.OnPhase(phase, d)
	}
}

// Driver restores VMs of one hypervisor.
type Driver interface {
	// Name is the hypervisor name used in chain links ("qemu", ...).
	Name() string
	// Capabilities reports the supported restore modes and snapshot kinds.
	Capabilities(ctx context.Context) (Capabilities, error)
	// Restore starts a hypervisor process and restores req.StagedDir into
	// it, leaving the VM paused. On error nothing is left running and
	// req.RunDir is gone.
	Restore(ctx context.Context, req RestoreRequest) (VM, error)
}

// VM is one running hypervisor process.
type VM interface {
	// PID of the hypervisor process.
	PID() int
	Resume(ctx context.Context) error
	Pause(ctx context.Context) error
	// Shutdown asks the VMM to stop the VM and exit, and waits for it.
	Shutdown(ctx context.Context) error
	// Kill sends SIGKILL to the hypervisor process.
	Kill() error
	// Wait blocks until the hypervisor process has exited, or ctx ends;
	// an exit already seen wins over an ended ctx, so an ended ctx asks
	// whether it has exited without waiting.
	Wait(ctx context.Context) error
	// DialAgent opens a byte stream to the guest agent.
	DialAgent(ctx context.Context) (net.Conn, error)
	// Close kills the process if it still runs and removes the run dir.
	Close() error
}

// ErrNoDiffBase is wrapped by a diff Snapshot that cannot be made because
// nothing says what the VM's memory was at its restore (it was booted, or
// its driver cannot tell): a full snapshot may still be.
var ErrNoDiffBase = errors.New("no base for a diff snapshot")

// BuildReporter is a driver that can name its hypervisor's build on
// request when its Capabilities leave Build empty (QEMU keeps the probe off
// the restore path).
type BuildReporter interface {
	Build(ctx context.Context) (string, error)
}

// Checkpointer is a VM that can write a chain link of itself into dir. The VM
// must be paused. A diff link's parent is the top link of the chain the VM
// was restored from, and it holds the pages changed since that restore.
type Checkpointer interface {
	Snapshot(ctx context.Context, dir string, kind SnapshotKind) error
}

// LiveCheckpointer is a Checkpointer that can also snapshot a running VM and
// leave it running: SnapshotLive stops the guest only while it captures
// its state (the hypervisor streams what it can while the guest runs, and
// the link is made durable after the guest runs again). The VM is left
// running, on error too.
type LiveCheckpointer interface {
	Checkpointer
	SnapshotLive(ctx context.Context, dir string, kind SnapshotKind) error
}

// DiskAttacher is a VM whose snapshot has spare disk slots (a microVM
// cannot hotplug devices): each is a read-only disk, empty until a
// filesystem image backs it, whose backend can be replaced while the VM
// runs, for a container joining it. The caller allocates the slots.
type DiskAttacher interface {
	// DiskSlots is how many spare slots the VM has, numbered from 0.
	DiskSlots() int
	// AttachDisk backs slot with the read-only image at path in place of
	// what backed it, and returns the serial by which the guest finds the
	// disk. A guest that probed the disk before keeps the size it read
	// then (an empty slot's is large) and its cached blocks: it reads the
	// new image once it drops them, if the image fits that size, else once
	// it probes the device again (rebinds its driver).
	AttachDisk(ctx context.Context, slot int, path string) (serial string, err error)
	// DetachDisk leaves slot empty; the hypervisor no longer holds the
	// image. The guest must have stopped using the disk.
	DetachDisk(ctx context.Context, slot int) error
}

// RootfsAttacher is a VM whose rootfs slot (RootfsSerial), restored
// empty, can be backed by an image while the VM runs: a VM restored before
// its task's image is known (a pooled VM) gets the image when it is
// claimed. The guest reads it as RestoreRequest.Disk's (its Init names
// the image's size, so the guest drops what it read of the empty slot).
type RootfsAttacher interface {
	AttachRootfs(ctx context.Context, path string) error
}
