package firecracker

import (
	"context"
	"encoding/json"
	"fmt"
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

const memBytes = 16 * 4096

// testVMState is a vmstate in the fake's format: it needs the memory size
// to set up Uffd-backed guest memory as Firecracker would.
var testVMState = fmt.Sprintf(`{"memory_bytes":%d}`, memBytes)

// stageChain writes a one-link Firecracker chain and stages it as the
// snapshotter would: memory, a private vmstate and chain.json.
func stageChain(t testing.TB) string {
	t.Helper()
	linkDir, staged := t.TempDir(), t.TempDir()
	mem := make([]byte, memBytes)
	for i := range mem {
		if (i/4096)%3 == 0 {
			mem[i] = byte(i)
		}
	}
	for _, dir := range []string{linkDir, staged} {
		if err := os.WriteFile(filepath.Join(dir, vmstateFile), []byte(testVMState), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	memPath := filepath.Join(staged, chain.StagedMemory)
	if err := os.WriteFile(memPath, mem, 0o444); err != nil {
		t.Fatal(err)
	}
	meta := chain.Meta{Hypervisor: Name, GuestOS: "linux", VCPUs: 1, StateFiles: []string{vmstateFile}}
	link, err := chain.WriteFull(context.Background(), memPath, meta, linkDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := chain.WriteStaged(staged, []*chain.Link{link}); err != nil {
		t.Fatal(err)
	}
	return staged
}

// newDriver returns a driver whose binary is a fake Firecracker, and the
// fake's request record.
func newDriver(t testing.TB, fake apifake.Fake) (*Driver, string) {
	t.Helper()
	fake.Spec, fake.Name, fake.Version = apifake.SpecFC, "Firecracker", "v1.16.1"
	bin, record := fake.Script(t)
	t.Cleanup(func() {
		for _, pid := range apifake.PIDs(t, record) {
			if apifake.Alive(pid) {
				t.Errorf("fake firecracker pid %d still running", pid)
			}
		}
	})
	return New(config.Firecracker{Binary: bin}), record
}

// bodies returns the recorded bodies of method op, decoded.
func bodies(t *testing.T, record, method, op string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, r := range apifake.Records(t, record) {
		if r.Method != method || r.Op != op {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(r.Body, &m); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// ops lists the recorded requests.
func ops(t *testing.T, record string) []string {
	t.Helper()
	var out []string
	for _, r := range apifake.Records(t, record) {
		out = append(out, r.Method+" "+r.Op)
	}
	return out
}

func runDir(t testing.TB) string {
	return filepath.Join(t.TempDir(), "run")
}
