package soak

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/stackrun"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// shortRestores and shortPods are the soak `make test` runs; `make soak`
// runs 1000 restores and 50 pods.
const (
	shortRestores = 50
	shortPods     = 2
	shortSpares   = 2
)

// TestSoak is the short soak: 50 restores through containerd, mixed copy
// and mmap, 8 at a time, a tenth of them killed (task, shim or QEMU), a
// quarter of them of an ordinary image, and two pods (a sandbox and two
// containers in one VM, one container killed and replaced), with two
// spares holding pooled VMs (the tasks that suit claim them; the others
// close them). It fails on a restore that failed other than by its kill,
// and on any count that did not come back.
func TestSoak(t *testing.T) {
	testenv.QEMU(t)
	bin := filepath.Dir(testenv.Bin(t, "containerd"))
	for _, name := range []string{"ctr", "cocoon-snapshotter", "containerd-shim-cocoon-v2", "cocoon-shim-server", "cocoonctl"} {
		testenv.Bin(t, name)
	}
	img, podImg := image(t, bin, 0), image(t, bin, PodDiskSlots)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	logs := filepath.Join(t.TempDir(), "daemons.log")
	res, err := Run(ctx, Options{
		BinDir: bin, Image: img, Restores: shortRestores, Parallel: 8, KillRate: 0.1, OrdinaryShare: 0.25, HostileShare: 0.1,
		Pods: shortPods, PodImage: podImg, Spares: shortSpares, Progress: testWriter{t}, Logs: logs,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + res.Markdown())
	if err := res.Err(); err != nil {
		data, _ := os.ReadFile(logs)
		t.Fatalf("%v\n%s", err, tail(string(data), logTail))
	}
}

// testWriter sends the soak's progress lines to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// image is a soak's snapshot image: the project's guest booted on QEMU,
// snapshotted with slots spare disk slots and packed as an OCI archive,
// cached in build/snapshots as for the demo and the benchmark.
func image(t *testing.T, bin string, slots int) Image {
	t.Helper()
	img, err := stackrun.EnsureImage(context.Background(), io.Discard, stackrun.ImageSpec{
		Guest: testenv.Guest(t), Cache: filepath.Join(testenv.RepoRoot(), "build", "snapshots"), Memory: "512M", BinDir: bin,
		DiskSlots: slots,
	})
	if err != nil {
		t.Fatal(err)
	}
	return Image{Ref: img.Ref, Archive: img.Archive}
}
