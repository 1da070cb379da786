package demo

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// TestDemo runs the demo as make demo does, so `make test` keeps it
// working: each mode's container prints its greeting and the shim's report.
func TestDemo(t *testing.T) {
	testenv.QEMU(t)
	guest := testenv.Guest(t)
	bin := filepath.Dir(testenv.Bin(t, "containerd"))
	for _, name := range []string{"ctr", "cocoon-snapshotter", "containerd-shim-cocoon-v2", "cocoon-shim-server", "cocoonctl"} {
		testenv.Bin(t, name)
	}
	var out bytes.Buffer
	err := Run(t.Context(), &out, Options{
		Guest: guest, Cache: filepath.Join(testenv.RepoRoot(), "build", "snapshots"), Memory: "512M", BinDir: bin,
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{
		"hello from demo-mmap, a microVM restored from a snapshot", "mode mmap,",
		"hello from demo-copy, a microVM restored from a snapshot", "mode copy,",
		"process started", "==> tear down",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
}
