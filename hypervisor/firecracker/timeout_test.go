package firecracker

import (
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/drivertest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/apifake"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

func TestRestoreTimeouts(t *testing.T) {
	testenv.RequireRoot(t) // Firecracker runs in a network namespace of its own
	drivertest.RestoreTimeouts(t, drivertest.Timeouts{
		Driver: func(bin string) hypervisor.Driver {
			return New(config.Firecracker{Binary: bin})
		},
		Hang:    fakeFC(apifake.Fake{Hang: []string{"snapshot/load"}}),
		HangErr: "PUT /snapshot/load: context deadline exceeded",
		Stage:   stageChain,
	})
}
