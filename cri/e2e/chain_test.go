package e2e

import (
	"os"
	"sync"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testimage"
)

// chainRef is the snapshot-chain image the cocoon handler's containers
// run: the project's guest, booted once on QEMU and baked.
const chainRef = "localhost/cri-e2e/chain:1"

// guestMemory is the chain image's guest memory size.
const guestMemory = 256 << 20

// chainDiskSlots is the chain image's spare disk slots: room for the
// containers of a pod that join its VM (TestCocoonPodVM's pod has up to
// four at once).
const chainDiskSlots = 8

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
		chain.archive, chain.err = testimage.Bake(cocoonctl, guest, chainRef, guestMemory, chain.dir, testimage.BakeOptions{DiskSlots: chainDiskSlots})
	})
	if chain.err != nil {
		t.Fatal(chain.err)
	}
	return chain.archive
}
