package cloudhypervisor

import (
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/drivertest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/apifake"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// The fork's diff snapshots become diff links of what changed since the
// restore: its first, a full baseline, is told against the restored
// memory, which a copy restore has released (the driver then says it has
// no base, and the shim writes a full link).
func TestDiffSnapshots(t *testing.T) {
	testenv.RequireRoot(t) // Cloud Hypervisor runs in a network namespace of its own
	for _, tt := range []struct {
		mode   hypervisor.Mode
		noBase bool
	}{{hypervisor.ModeMmap, false}, {hypervisor.ModeOnDemand, false}, {hypervisor.ModeCopy, true}} {
		t.Run(string(tt.mode), func(t *testing.T) {
			fake := fakeCH(apifake.SpecCHFork)
			fake.GuestWrites = drivertest.DiffRounds
			bin, record := fake.Script(t)
			d := New(config.CloudHypervisor{Binary: bin, CopyOnWrite: "yes"})
			drivertest.DiffSnapshots(t, d, stageChain(t), tt.mode, tt.noBase)
			if tt.noBase {
				return
			}
			for _, s := range apifake.Bodies(t, record, "PUT", "vm.snapshot") {
				if s["snapshot_type"] != "diff" {
					t.Errorf("vm.snapshot %v, want a diff", s)
				}
			}
		})
	}
}
