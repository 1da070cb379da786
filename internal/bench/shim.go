package bench

import (
	"context"
	"errors"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/oci"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/stackrun"
)

// shimStack is the private containerd every arm through containerd shares:
// the snapshot image on the cocoon snapshotter, and the ordinary busybox
// image the runc and ordinary arms run.
type shimStack struct {
	stack    *devstack.Stack
	cl       *client.Client
	snapshot client.Image
	top      string // the snapshot image's chain ID
	guestKiB int64  // the snapshot's guest memory
	busybox  client.Image
}

// shimConfig is the cocoon config the shims run with: the annotation picks
// the mode, and strict makes a mode QEMU cannot do fail instead of falling
// back, so a cell never measures another mode than its name. An ordinary
// image restores the snapshot image.
func shimConfig(img stackrun.SnapshotImage) (*config.Config, error) {
	cfg, err := stackrun.AnnotatedConfig()
	if err != nil {
		return nil, err
	}
	cfg.Restore.Strict = true
	cfg.Restore.BaseImage = img.Ref
	cfg.Agent.ConnectTimeout = config.Duration(agentTimeout)
	cfg.Shim.RestoreTimeout = config.Duration(2 * agentTimeout)
	return cfg, nil
}

func newShimStack(ctx context.Context, binDir string, img stackrun.SnapshotImage, guestKiB int64) (*shimStack, error) {
	cfg, err := shimConfig(img)
	if err != nil {
		return nil, err
	}
	stack, image, err := stackrun.StartStack(ctx, binDir, cfg, img)
	if err != nil {
		return nil, err
	}
	s := &shimStack{stack: stack, snapshot: image, guestKiB: guestKiB}
	s.cl, _ = stack.Client()
	if s.top, err = chainID(ctx, image); err != nil {
		return nil, errors.Join(err, stack.Close())
	}
	return s, nil
}

// stage stages the snapshot chain for one clone through containerd's
// snapshot API, removes it again and returns how long staging took.
func (s *shimStack) stage(ctx context.Context) (time.Duration, error) {
	return prepareOnce(ctx, s.cl.SnapshotService(devstack.Snapshotter), "first", s.top)
}

func (s *shimStack) close() error { return s.stack.Close() }

// shimArm runs containers through containerd and the cocoon shim in one
// mode: the snapshot image, or with image set an ordinary image on the
// snapshot image as base; opts add to each container's spec, and
// runtime, when set, are the runtime's options (a config of its own).
type shimArm struct {
	s       *shimStack
	mode    hypervisor.Mode
	image   client.Image
	opts    func(id string) []oci.SpecOpts
	runtime any
}

func (a shimArm) start(ctx context.Context, id string) (*clone, error) {
	image := a.s.snapshot
	var opts []oci.SpecOpts
	if a.image != nil {
		image = a.image
		opts = append(opts, oci.WithImageConfig(image))
	}
	if a.opts != nil {
		opts = append(opts, a.opts(id)...)
	}
	spec := stackrun.Cocoon(id, image, a.mode, benchArgs, opts...)
	spec.RuntimeOptions = a.runtime
	start := time.Now()
	rc, err := stackrun.Run(ctx, a.s.cl, spec)
	if err != nil {
		return nil, err
	}
	c := &clone{pid: int(rc.Task.Pid()), guestKiB: a.s.guestKiB, ready: time.Since(start), stop: rc.Stop}
	rep, err := stackrun.ReadReport(a.s.stack, id)
	if err != nil {
		return nil, errors.Join(err, rc.Stop(ctx))
	}
	c.phases = append(c.phases, phase{Name: phaseContainer, Duration: rc.Created})
	for _, ph := range rep.Phases {
		c.phases = append(c.phases, phase{Name: ph.Name, Duration: time.Duration(ph.Duration)})
	}
	return c, nil
}
