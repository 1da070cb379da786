// Package cloudhypervisor drives Cloud Hypervisor over its REST API.
//
// A VM is restored from a staged chain by building a snapshot directory in
// the staged directory (config.json patched to the run directory's sockets,
// state.json, and memory-ranges = a hard link of the staged memory file)
// and asking a fresh `cloud-hypervisor --api-socket` process to vm.restore it. Restore
// modes map to memory_restore_mode: copy omits it (Copy), ondemand is
// "OnDemand" (userfaultfd inside Cloud Hypervisor), mmap is "CopyOnWrite",
// which only the cocoonstack fork has.
//
// Cloud Hypervisor opens a network device's tap by name, in its own
// network namespace, so it is started in the restore's namespace and the
// snapshot's one network device gets the restore's tap; without one it
// gets a tap Cloud Hypervisor makes in a namespace of its own. The
// snapshot's rootfs slot (the disk with serial hypervisor.RootfsSerial,
// or its only disk) gets the restore's filesystem image, read-only, with
// the slot's recorded capacity set to the image's. No other disk or host
// end the image names reaches Cloud Hypervisor (see vmConfigSchema).
package cloudhypervisor

import (
	"context"
	"fmt"
	"sync"

	"github.com/containerd/log"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// Files in a VM's run directory.
const (
	apiSock   = "api.sock"
	vsockSock = "vsock.sock"
	vmmLog    = "cloud-hypervisor.log"
)

// Name is the hypervisor's name in chain links.
const Name = hypervisor.CloudHypervisor

// Driver restores Cloud Hypervisor VMs.
type Driver struct {
	cfg config.CloudHypervisor

	mu   sync.Mutex
	caps *hypervisor.Capabilities
}

var _ hypervisor.Driver = (*Driver)(nil)

// New returns a driver for the binary and CopyOnWrite setting in cfg.
func New(cfg config.CloudHypervisor) *Driver {
	return &Driver{cfg: cfg}
}

// Name is "cloud-hypervisor".
func (d *Driver) Name() string { return Name }

// Capabilities asks the binary for its build and, unless the config pins
// it, whether it has CopyOnWrite. The answer is kept for the driver's life.
func (d *Driver) Capabilities(ctx context.Context) (hypervisor.Capabilities, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.caps != nil {
		return *d.caps, nil
	}
	build, err := version(ctx, d.cfg.Binary)
	if err != nil {
		return hypervisor.Capabilities{}, err
	}
	cow, err := d.copyOnWrite(ctx)
	if err != nil {
		return hypervisor.Capabilities{}, err
	}
	caps := hypervisor.Capabilities{
		RestoreModes:  []hypervisor.Mode{hypervisor.ModeOnDemand, hypervisor.ModeCopy},
		SnapshotKinds: []hypervisor.SnapshotKind{hypervisor.SnapshotFull, hypervisor.SnapshotDiff},
		Build:         build,
	}
	if cow {
		caps.RestoreModes = append([]hypervisor.Mode{hypervisor.ModeMmap}, caps.RestoreModes...)
	}
	log.G(ctx).WithField("build", build).WithField("copy_on_write", cow).Debug("cloud hypervisor capabilities")
	d.caps = &caps
	return caps, nil
}

func (d *Driver) copyOnWrite(ctx context.Context) (bool, error) {
	switch d.cfg.CopyOnWrite {
	case "yes":
		return true, nil
	case "no":
		return false, nil
	case "probe", "":
		return probeCopyOnWrite(ctx, d.cfg.Binary)
	}
	return false, fmt.Errorf("cloud_hypervisor.copy_on_write = %q: want probe, yes or no", d.cfg.CopyOnWrite)
}

// memoryRestoreMode is the vm.restore memory_restore_mode for m; empty
// means omit it (Cloud Hypervisor's default, Copy).
func memoryRestoreMode(m hypervisor.Mode) (string, error) {
	switch m {
	case hypervisor.ModeCopy:
		return "", nil
	case hypervisor.ModeOnDemand:
		return "OnDemand", nil
	case hypervisor.ModeMmap:
		return "CopyOnWrite", nil
	}
	return "", fmt.Errorf("unknown restore mode %q: want one of mmap, ondemand, copy", m)
}
