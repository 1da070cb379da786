package cloudhypervisor

import (
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/drivertest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/apifake"
)

func TestRestoreTimeouts(t *testing.T) {
	hang := fakeCH(apifake.SpecCHFork)
	hang.Hang = []string{"vm.restore"}
	drivertest.RestoreTimeouts(t, drivertest.Timeouts{
		Driver: func(bin string) hypervisor.Driver {
			return New(config.CloudHypervisor{Binary: bin, CopyOnWrite: "no"})
		},
		Hang:    hang,
		HangErr: "vm.restore: context deadline exceeded",
		Stage:   stageChain,
	})
}
