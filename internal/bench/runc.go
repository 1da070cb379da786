package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/v2/pkg/oci"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/stackrun"
)

// The runc arm's runtime and snapshotter: containerd's defaults for Linux.
const (
	runcRuntime     = "io.containerd.runc.v2"
	runcSnapshotter = "overlayfs"
	runcShim        = "containerd-shim-runc-v2"
)

// runcArm runs the ordinary busybox image with runc through the same
// containerd: the floor of any container start on this host.
type runcArm struct{ s *shimStack }

// checkRunc says what is missing for the runc arm: Debian's runc on PATH
// and containerd's runc shim next to containerd.
func checkRunc(binDir string) error {
	if _, err := exec.LookPath("runc"); err != nil {
		return fmt.Errorf("runc arm: %w (install Debian's runc: scripts/install-deps.sh)", err)
	}
	if _, err := os.Stat(filepath.Join(binDir, runcShim)); err != nil {
		return fmt.Errorf("runc arm: %w (make build)", err)
	}
	return nil
}

func (a runcArm) start(ctx context.Context, id string) (*clone, error) {
	img := a.s.busybox
	start := time.Now()
	rc, err := stackrun.Run(ctx, a.s.cl, stackrun.Container{
		ID: id, Image: img, Snapshotter: runcSnapshotter, Runtime: runcRuntime,
		Spec: []oci.SpecOpts{oci.WithImageConfig(img), oci.WithProcessArgs(benchArgs...), oci.WithHostname(id)},
	})
	if err != nil {
		return nil, err
	}
	return &clone{
		pid: int(rc.Task.Pid()), ready: time.Since(start), stop: rc.Stop,
		phases: []phase{{Name: phaseContainer, Duration: rc.Created}},
	}, nil
}
