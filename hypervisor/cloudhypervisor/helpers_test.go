package cloudhypervisor

import (
	"os"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/drivertest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/apifake"
)

func TestMain(m *testing.M) {
	apifake.RunIfFake()
	os.Exit(m.Run())
}

// testConfig is a config.json as Cloud Hypervisor writes it, with a field
// this driver has never heard of (holding no string, so it is kept).
const testConfig = `{"cpus":{"boot_vcpus":1,"max_vcpus":1},"memory":{"size":65536,"shared":false},` +
	`"payload":{"kernel":"/old/vmlinux","cmdline":"console=ttyS0","initramfs":"/old/initrd"},` +
	`"rng":{"src":"/dev/urandom","iommu":false},` +
	`"serial":{"file":null,"mode":"Socket","socket":"/old/serial.sock"},` +
	`"console":{"file":null,"mode":"Off","socket":null},` +
	`"vsock":{"cid":3,"socket":"/old/vsock.sock","id":"_vsock0"},` +
	`"future_device":{"on":true,"n":[1,2,3]}}`

// stageChain writes a one-link Cloud Hypervisor chain and stages it as the
// snapshotter would: memory, private state files and chain.json.
func stageChain(t testing.TB) string {
	return drivertest.StageChain(t, Name, map[string][]byte{
		configFile: []byte(testConfig),
		stateFile:  []byte(`{"snapshot_data":{}}`),
	})
}

// newDriver returns a driver whose binary is a fake Cloud Hypervisor
// validating against spec, and the fake's request record.
func newDriver(t testing.TB, spec, cow string, fail ...string) (*Driver, string) {
	t.Helper()
	bin, record := fakeCH(spec, fail...).Script(t)
	return New(config.CloudHypervisor{Binary: bin, CopyOnWrite: cow}), record
}

// fakeCH is a fake Cloud Hypervisor validating against spec.
func fakeCH(spec string, fail ...string) apifake.Fake {
	return apifake.Fake{Spec: spec, Name: "cloud-hypervisor", Version: "v53.0", Fail: fail}
}
