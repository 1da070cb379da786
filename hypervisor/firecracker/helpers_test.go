package firecracker

import (
	"fmt"
	"os"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/drivertest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/apifake"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

func TestMain(m *testing.M) {
	apifake.RunIfFake()
	os.Exit(m.Run())
}

// testVMState is a vmstate in the fake's format: it needs the memory size
// to set up Uffd-backed guest memory as Firecracker would.
var testVMState = fmt.Sprintf(`{"memory_bytes":%d}`, drivertest.MemBytes)

// stageChain writes a one-link Firecracker chain and stages it as the
// snapshotter would: memory, a private vmstate and chain.json.
func stageChain(t testing.TB) string {
	return drivertest.StageChain(t, Name, map[string][]byte{vmstateFile: []byte(testVMState)})
}

// newDriver returns a driver whose binary is a fake Firecracker, and the
// fake's request record. It needs root: a restore without a network runs
// Firecracker in a network namespace of its own.
func newDriver(t testing.TB, fake apifake.Fake) (*Driver, string) {
	t.Helper()
	testenv.RequireRoot(t)
	bin, record := fakeFC(fake).Script(t)
	return New(config.Firecracker{Binary: bin}), record
}

// fakeFC is fake as a Firecracker v1.16.1 validating against its spec.
func fakeFC(fake apifake.Fake) apifake.Fake {
	fake.Spec, fake.Name, fake.Version = apifake.SpecFC, "Firecracker", "v1.16.1"
	return fake
}
