package devstack

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

func TestDestroyRefusesOtherDirs(t *testing.T) {
	for _, dir := range []string{"/etc", "/tmp", "/tmp/other-1", "/tmp/ctrd-1/../../etc", "/var/tmp/ctrd-1"} {
		if err := Destroy(dir); err == nil || !strings.Contains(err.Error(), "not a devstack dir") {
			t.Errorf("Destroy(%q) = %v, want a not-a-devstack-dir error", dir, err)
		}
	}
}

func TestStartRequiresBinaries(t *testing.T) {
	if _, err := Start(t.Context(), Options{}); err == nil {
		t.Error("Start without a bin dir succeeded")
	}
	_, err := Start(t.Context(), Options{BinDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "containerd missing") {
		t.Errorf("Start with an empty bin dir = %v, want an error naming containerd", err)
	}
}

// TestDestroyKeptStack tears down a running stack from its dir alone, as
// `cocoonctl demo --down` does, including a process the stack did not
// start itself (standing in for a re-parented shim).
func TestDestroyKeptStack(t *testing.T) {
	testenv.RequireRoot(t)
	bin := filepath.Dir(testenv.Bin(t, "containerd"))
	for _, name := range []string{"ctr", "cocoon-snapshotter", "containerd-shim-cocoon-v2"} {
		testenv.Bin(t, name)
	}
	s, err := Start(t.Context(), Options{BinDir: bin, Namespace: "devstack-test"})
	if err != nil {
		t.Fatal(err)
	}
	dir := s.Dir
	t.Cleanup(func() {
		if _, err := os.Stat(dir); err == nil {
			s.Close()
		}
	})
	if _, err := s.Ctr(t.Context(), "namespaces", "create", "devstack-test"); err != nil {
		t.Fatal(err)
	}
	straggler := exec.Command("sleep", "600")
	straggler.Dir = s.RunDir
	if err := os.MkdirAll(s.RunDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := straggler.Start(); err != nil {
		t.Fatal(err)
	}
	go straggler.Wait()
	if err := Destroy(dir); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if left := Leftovers(dir); len(left) > 0 {
		t.Errorf("Destroy left:\n%s", strings.Join(left, "\n"))
	}
}
