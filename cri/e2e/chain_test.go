package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// chainRef is the snapshot-chain image the cocoon handler's containers
// run: the project's guest, booted once on QEMU and baked.
const chainRef = "localhost/cri-e2e/chain:1"

// guestMemory is the chain image's guest memory size.
const guestMemory = 256 << 20

var chain struct {
	once    sync.Once
	dir     string
	archive string
	err     error
}

// chainImage bakes the chain image once per test binary and returns its
// archive.
func chainImage(t testing.TB) string {
	t.Helper()
	testenv.QEMU(t)
	guest := testenv.Guest(t)
	cocoonctl := testenv.Bin(t, "cocoonctl")
	chain.once.Do(func() {
		if chain.dir, chain.err = os.MkdirTemp("", "cri-e2e-chain-"); chain.err != nil {
			return
		}
		chain.archive = filepath.Join(chain.dir, "chain.tar")
		cmd := exec.Command(cocoonctl, "bake", "--guest", guest, "--memory", strconv.Itoa(guestMemory>>20)+"M",
			"--out", filepath.Join(chain.dir, "link"), "--image", chainRef, "--archive", chain.archive,
			"--config", "/dev/null", "--timeout", "4m")
		if out, err := cmd.CombinedOutput(); err != nil {
			chain.err = fmt.Errorf("bake the chain image: %w\n%s", err, out)
		}
	})
	if chain.err != nil {
		t.Fatal(chain.err)
	}
	return chain.archive
}
