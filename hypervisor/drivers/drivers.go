// Package drivers builds the hypervisor driver a config names. It is the
// one package that knows every driver, so that neither the restore policy
// nor the drivers themselves import each other.
package drivers

import (
	"fmt"
	"strings"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/cloudhypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/firecracker"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/qemu"
)

// New returns the driver cfg.Hypervisor names, configured from its section
// of cfg.
func New(cfg config.Config) (hypervisor.Driver, error) {
	switch cfg.Hypervisor {
	case hypervisor.QEMU:
		return qemu.New(cfg.QEMU), nil
	case hypervisor.CloudHypervisor:
		return cloudhypervisor.New(cfg.CloudHypervisor), nil
	case hypervisor.Firecracker:
		return firecracker.New(cfg.Firecracker), nil
	}
	return nil, fmt.Errorf("hypervisor %q: want one of %s", cfg.Hypervisor, strings.Join(hypervisor.Names, ", "))
}
