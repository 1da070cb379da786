package guest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// TestBuildReproducible builds the guest twice from the same inputs and
// expects byte-identical outputs.
func TestBuildReproducible(t *testing.T) {
	for _, tool := range []string{"apt-get", "dpkg-deb", "cpio", "gzip"} {
		testenv.LookPath(t, tool)
	}
	agent := testenv.Bin(t, "cocoon-agent")
	cinit := testenv.Bin(t, "cocoon-cinit")
	runc := testenv.Bin(t, "guest/runc")
	var builds [2]string
	for i := range builds {
		builds[i] = filepath.Join(t.TempDir(), "guest")
		cmd := exec.Command("./build.sh", builds[i])
		cmd.Env = append(os.Environ(), "COCOON_AGENT="+agent, "COCOON_CINIT="+cinit, "COCOON_RUNC="+runc)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build.sh: %v\n%s", err, out)
		}
	}
	for _, f := range []string{"vmlinuz", "initramfs.cpio.gz", "BUILDINFO"} {
		a, errA := os.ReadFile(filepath.Join(builds[0], f))
		b, errB := os.ReadFile(filepath.Join(builds[1], f))
		if errA != nil || errB != nil {
			t.Fatalf("read %s: %v %v", f, errA, errB)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs between two builds of the same inputs", f)
		}
	}
}
