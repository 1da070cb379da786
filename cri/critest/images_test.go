package critest_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testimage"
)

// The images the test builds: the pod sandbox (pause) image every node
// imports, and the chain image the cocoon handler restores its VMs from.
const (
	pauseRef = "localhost/critest/pause:1"
	chainRef = "localhost/critest/chain:1"
	// guestMemory is the chain image's guest memory.
	guestMemory = 256 << 20
	// podVMDiskSlots is the chain image's spare disk slots with one VM
	// per pod: one for each container of a pod at once (critest's pods
	// have up to three). Without, it has none: each slot adds some QEMU
	// start-up to every restore.
	podVMDiskSlots = 8
)

// built holds what the test builds once per test binary.
var built struct {
	once sync.Once
	dir  string
	// pauseTar is the pause image's archive; layouts are critest's
	// images, each an OCI layout dir by its reference.
	pauseTar string
	layouts  map[string]string
	err      error

	chainOnce sync.Once
	chainTar  string
	chainErr  error
}

// images builds the pause image's archive and critest's images as OCI
// layout dirs (what crane push reads), once.
func images(t *testing.T) {
	t.Helper()
	testenv.LookPath(t, testimage.DefaultBusybox)
	testenv.LookPath(t, "tar")
	built.once.Do(func() { built.err = buildImages(context.Background()) })
	if built.err != nil {
		t.Fatal(built.err)
	}
}

func buildImages(ctx context.Context) error {
	var err error
	if built.dir, err = os.MkdirTemp("", "critest-images-"); err != nil {
		return err
	}
	pause, err := testimage.Pause(ctx, pauseRef, built.dir)
	if err != nil {
		return err
	}
	built.pauseTar = filepath.Join(built.dir, "pause.tar")
	if err := testimage.WriteArchiveFile(ctx, built.pauseTar, pause); err != nil {
		return err
	}
	imgs, err := testimage.CritestImages(ctx, built.dir, testimage.DefaultBusybox, pause)
	if err != nil {
		return err
	}
	built.layouts = map[string]string{}
	for i, img := range imgs {
		dir := filepath.Join(built.dir, strconv.Itoa(i))
		if err := writeLayout(ctx, dir, img); err != nil {
			return err
		}
		built.layouts[img.Name] = dir
	}
	return nil
}

// writeLayout writes img as an OCI image layout in dir.
func writeLayout(ctx context.Context, dir string, img testimage.Image) error {
	tarball := dir + ".tar"
	if err := testimage.WriteArchiveFile(ctx, tarball, img); err != nil {
		return err
	}
	defer os.Remove(tarball)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, "tar", "-xf", tarball, "-C", dir).CombinedOutput(); err != nil {
		return fmt.Errorf("unpack the layout of %s: %w: %s", img.Name, err, out)
	}
	return nil
}

// chainImage bakes the chain image once per test binary (the project's
// guest booted on QEMU and snapshotted) and returns its archive.
func chainImage(t *testing.T) string {
	t.Helper()
	testenv.QEMU(t)
	guest := testenv.Guest(t)
	cocoonctl := testenv.Bin(t, "cocoonctl")
	images(t)
	built.chainOnce.Do(func() {
		built.chainTar, built.chainErr = testimage.Bake(cocoonctl, guest, chainRef, guestMemory, built.dir, chainBakeOptions())
	})
	if built.chainErr != nil {
		t.Fatal(built.chainErr)
	}
	return built.chainTar
}

// chainBakeOptions shapes the chain image for the cocoon handler's run.
func chainBakeOptions() testimage.BakeOptions {
	if *containerVM {
		return testimage.BakeOptions{}
	}
	return testimage.BakeOptions{DiskSlots: podVMDiskSlots}
}
