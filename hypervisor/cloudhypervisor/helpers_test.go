package cloudhypervisor

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/apifake"
)

func TestMain(m *testing.M) {
	apifake.RunIfFake()
	os.Exit(m.Run())
}

// testConfig is a config.json as Cloud Hypervisor writes it, with a field
// this driver has never heard of.
const testConfig = `{"cpus":{"boot_vcpus":1,"max_vcpus":1},"memory":{"size":65536,"shared":false},` +
	`"serial":{"file":null,"mode":"Socket","socket":"/old/serial.sock"},` +
	`"console":{"file":null,"mode":"Off","socket":null},` +
	`"vsock":{"cid":3,"socket":"/old/vsock.sock","id":"_vsock0"},` +
	`"future_device":{"path":"/keep/me","n":[1,2,3]}}`

const memBytes = 16 * 4096

// stageChain writes a one-link Cloud Hypervisor chain and stages it as the
// snapshotter would: memory, private state files and chain.json.
func stageChain(t testing.TB) string {
	t.Helper()
	linkDir, staged := t.TempDir(), t.TempDir()
	mem := make([]byte, memBytes)
	for i := range mem {
		if (i/4096)%3 == 0 {
			mem[i] = byte(i)
		}
	}
	files := map[string][]byte{configFile: []byte(testConfig), stateFile: []byte(`{"snapshot_data":{}}`)}
	for name, data := range files {
		for _, dir := range []string{linkDir, staged} {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	memPath := filepath.Join(staged, chain.StagedMemory)
	if err := os.WriteFile(memPath, mem, 0o444); err != nil {
		t.Fatal(err)
	}
	meta := chain.Meta{Hypervisor: Name, GuestOS: "linux", VCPUs: 1, StateFiles: stateFiles}
	link, err := chain.WriteFull(context.Background(), memPath, meta, linkDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := chain.WriteStaged(staged, []*chain.Link{link}); err != nil {
		t.Fatal(err)
	}
	return staged
}

// newDriver returns a driver whose binary is a fake Cloud Hypervisor
// validating against spec, and the fake's request record.
func newDriver(t testing.TB, spec, cow string, fail ...string) (*Driver, string) {
	t.Helper()
	bin, record := apifake.Fake{Spec: spec, Name: "cloud-hypervisor", Version: "v53.0", Fail: fail}.Script(t)
	t.Cleanup(func() {
		for _, pid := range apifake.PIDs(t, record) {
			if apifake.Alive(pid) {
				t.Errorf("fake cloud-hypervisor pid %d still running", pid)
			}
		}
	})
	return New(config.CloudHypervisor{Binary: bin, CopyOnWrite: cow}), record
}

// bodies returns the recorded request bodies of op, decoded.
func bodies(t *testing.T, record, op string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, r := range apifake.Records(t, record) {
		if r.Op != op {
			continue
		}
		var m map[string]any
		if len(r.Body) > 0 {
			if err := json.Unmarshal(r.Body, &m); err != nil {
				t.Fatal(err)
			}
		}
		out = append(out, m)
	}
	return out
}

// ops lists the recorded operations with their status.
func ops(t *testing.T, record string) []string {
	t.Helper()
	var out []string
	for _, r := range apifake.Records(t, record) {
		out = append(out, r.Method+" "+r.Op)
	}
	return out
}

// runDir is a fresh run directory path (not created).
func runDir(t testing.TB) string {
	return filepath.Join(t.TempDir(), "run")
}
