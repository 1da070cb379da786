package cloudhypervisor

import (
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/drivertest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/apifake"
)

// BenchmarkRestore measures the driver's own cost of a restore against the
// fake: spawn, API socket wait, restore dir, vm.restore, then Close.
func BenchmarkRestore(b *testing.B) {
	drivertest.BenchRestore(b, func(tb testing.TB) hypervisor.Driver {
		d, _ := newDriver(tb, apifake.SpecCHFork, "yes")
		return d
	}, stageChain)
}
