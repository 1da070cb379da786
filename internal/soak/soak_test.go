package soak

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// shortRestores is the soak `make test` runs; `make soak` runs 1000.
const shortRestores = 50

// TestSoak is the short soak: 50 restores through containerd, mixed copy
// and mmap, 8 at a time, a tenth of them killed (task, shim or QEMU), a
// quarter of them of an ordinary image. It fails on a restore that failed
// other than by its kill, and on any count that did not come back.
func TestSoak(t *testing.T) {
	testenv.QEMU(t)
	bin := filepath.Dir(testenv.Bin(t, "containerd"))
	for _, name := range []string{"ctr", "cocoon-snapshotter", "containerd-shim-cocoon-v2"} {
		testenv.Bin(t, name)
	}
	img := bake(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	logs := filepath.Join(t.TempDir(), "daemons.log")
	res, err := Run(ctx, Options{
		BinDir: bin, Image: img, Restores: shortRestores, Parallel: 8, KillRate: 0.1, OrdinaryShare: 0.25,
		Progress: testWriter{t}, Logs: logs,
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

// bake makes the soak's snapshot image: the project's guest booted on
// QEMU, snapshotted and packed as an OCI archive.
func bake(t *testing.T) Image {
	t.Helper()
	guest := testenv.Guest(t)
	dir := t.TempDir()
	img := Image{Ref: "example.com/cocoon/soak:1", Archive: filepath.Join(dir, "image.tar")}
	cmd := exec.Command(testenv.Bin(t, "cocoonctl"), "bake", "--guest", guest, "--memory", "256M",
		"--out", filepath.Join(dir, "link"), "--image", img.Ref, "--archive", img.Archive,
		"--config", os.DevNull, "--timeout", "4m")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("bake the soak's image: %v\n%s", err, out)
	}
	return img
}
