// Package firecracker drives Firecracker over its REST API.
//
// A VM is restored by a fresh `firecracker --api-sock` process loading the
// staged chain with PUT /snapshot/load, paused (resume_vm false), its vsock
// device's host socket moved into the run directory (vsock_override).
// Restore modes map to the memory backend: mmap is the File backend over
// the staged hard link itself (Firecracker maps it privately), copy is the
// File backend over a private copy in the run directory, ondemand is the Uffd
// backend served by cocoon's page-fault handler (package uffd) from the
// staged memory file.
//
// Firecracker runs in the restore's network namespace, or, when the
// restore gives neither a namespace nor a NIC, in one of its own. The
// restore's tap goes behind the snapshot's network interface eth0
// (network_overrides), and its filesystem image behind the rootfs slot,
// which a cocoon snapshot records as the relative path cocoon-rootfs that
// the driver fills in the run directory (see placeRootfs). Devices whose
// host ends the image chose are refused once loaded (see restored.go).
package firecracker

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// Files in a VM's run directory.
const (
	apiSock   = "api.sock"
	vsockSock = "vsock.sock"
	uffdSock  = "uffd.sock"
	memCopy   = "memory"
	vmmLog    = "firecracker.log"
)

// Name is the hypervisor's name in chain links.
const Name = hypervisor.Firecracker

// vmstateFile is the state file of a Firecracker link.
const vmstateFile = "vmstate"

// restoreModes are the modes this driver restores in, best first.
var restoreModes = []hypervisor.Mode{hypervisor.ModeMmap, hypervisor.ModeOnDemand, hypervisor.ModeCopy}

// versionTimeout bounds `firecracker --version`.
const versionTimeout = 5 * time.Second

// Driver restores Firecracker VMs.
type Driver struct {
	cfg config.Firecracker

	mu    sync.Mutex
	build string
}

var _ hypervisor.Driver = (*Driver)(nil)

// New returns a driver for the binary in cfg.
func New(cfg config.Firecracker) *Driver {
	return &Driver{cfg: cfg}
}

// Name is "firecracker".
func (d *Driver) Name() string { return Name }

// Capabilities reports the modes Firecracker restores in and the binary's
// build, asked once.
func (d *Driver) Capabilities(ctx context.Context) (hypervisor.Capabilities, error) {
	build, err := d.version(ctx)
	if err != nil {
		return hypervisor.Capabilities{}, err
	}
	return hypervisor.Capabilities{
		RestoreModes:  restoreModes,
		SnapshotKinds: []hypervisor.SnapshotKind{hypervisor.SnapshotFull, hypervisor.SnapshotDiff},
		Build:         build,
	}, nil
}

func (d *Driver) version(ctx context.Context) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.build != "" {
		return d.build, nil
	}
	ctx, cancel := context.WithTimeout(ctx, versionTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, d.cfg.Binary, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", d.cfg.Binary, err)
	}
	d.build, _, _ = strings.Cut(strings.TrimSpace(string(out)), "\n")
	return d.build, nil
}
