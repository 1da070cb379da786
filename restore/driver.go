package restore

import (
	"fmt"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/cloudhypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/firecracker"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/qemu"
)

// NewDriver returns the driver cfg.Hypervisor names, configured from its
// section of cfg.
func NewDriver(cfg config.Config) (hypervisor.Driver, error) {
	switch cfg.Hypervisor {
	case "qemu":
		return qemu.New(cfg.QEMU), nil
	case "cloud-hypervisor":
		return cloudhypervisor.New(cfg.CloudHypervisor), nil
	case "firecracker":
		return firecracker.New(cfg.Firecracker), nil
	}
	return nil, fmt.Errorf("hypervisor %q: want one of qemu, cloud-hypervisor, firecracker", cfg.Hypervisor)
}
