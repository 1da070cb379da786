package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/opencontainers/image-spec/identity"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
	"github.com/cocoonstack/containerd-shim-cocoon/restore"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
)

// shimPath restores through a private containerd: the Go client creates a
// container on the cocoon snapshotter with the cocoon runtime, and the shim
// restores its VM; the mode is asked for with the restore-mode annotation.
type shimPath struct {
	stack *devstack.Stack
	cl    *client.Client
	image client.Image
	top   string
}

// shimConfig is the cocoon config the shims run with: the annotation picks
// the mode, and strict makes a mode QEMU cannot do fail instead of falling
// back, so a cell never measures another mode than its name.
func shimConfig() (*config.Config, error) {
	cfg, err := config.Load("")
	if err != nil {
		return nil, err
	}
	cfg.Restore.AllowAnnotation = true
	cfg.Restore.Strict = true
	cfg.Agent.ConnectTimeout = config.Duration(benchAgentTimeout)
	cfg.Shim.RestoreTimeout = config.Duration(2 * benchAgentTimeout)
	return &cfg, nil
}

// startStack starts a private containerd with the shims configured by
// shimConfig and imports img into it.
func startStack(ctx context.Context, binDir string, img snapshotImage) (*devstack.Stack, client.Image, error) {
	cfg, err := shimConfig()
	if err != nil {
		return nil, nil, err
	}
	stack, err := devstack.Start(ctx, devstack.Options{BinDir: binDir, Config: cfg, LogLevel: "info"})
	if err != nil {
		return nil, nil, err
	}
	image, err := importImage(ctx, stack, img)
	if err != nil {
		return nil, nil, errors.Join(err, stack.Close())
	}
	return stack, image, nil
}

func importImage(ctx context.Context, stack *devstack.Stack, img snapshotImage) (client.Image, error) {
	if _, err := stack.Ctr(ctx, "images", "import", "--snapshotter", devstack.Snapshotter, img.Archive); err != nil {
		return nil, err
	}
	cl, err := stack.Client()
	if err != nil {
		return nil, err
	}
	image, err := cl.GetImage(ctx, img.Ref)
	if err != nil {
		return nil, fmt.Errorf("imported image: %w", err)
	}
	return image, nil
}

func newShimPath(ctx context.Context, binDir string, img snapshotImage) (*shimPath, error) {
	stack, image, err := startStack(ctx, binDir, img)
	if err != nil {
		return nil, err
	}
	p := &shimPath{stack: stack, image: image}
	p.cl, _ = stack.Client()
	diffIDs, err := image.RootFS(ctx)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("image layers: %w", err), stack.Close())
	}
	p.top = identity.ChainID(diffIDs).String()
	return p, nil
}

func (p *shimPath) name() string { return "shim" }

func (p *shimPath) stage(ctx context.Context) (time.Duration, error) {
	sn := p.cl.SnapshotService(devstack.Snapshotter)
	start := time.Now()
	if _, err := sn.Prepare(ctx, "first", p.top); err != nil {
		return 0, fmt.Errorf("stage first clone: %w", err)
	}
	d := time.Since(start)
	return d, sn.Remove(ctx, "first")
}

func (p *shimPath) start(ctx context.Context, id string, mode hypervisor.Mode) (*clone, error) {
	start := time.Now()
	rc, err := runContainer(ctx, p.cl, p.image, id, mode, cio.NullIO)
	if err != nil {
		return nil, err
	}
	c := &clone{pid: int(rc.task.Pid()), ready: time.Since(start), stop: rc.stop}
	rep, err := state.ReadReport(bundleDir(p.stack, id))
	if err != nil {
		return nil, errors.Join(fmt.Errorf("restore report of %s: %w", id, err), rc.stop(ctx))
	}
	c.phases = append(c.phases, phase{Name: containerPhase, Duration: rc.created})
	for _, ph := range rep.Phases {
		c.phases = append(c.phases, phase{Name: ph.Name, Duration: time.Duration(ph.Duration)})
	}
	return c, nil
}

// containerPhase is the client's NewContainer: containerd's metadata and
// the container snapshot cocoon-snapshotter stages.
const containerPhase = "container"

// runningContainer is a container whose task runs.
type runningContainer struct {
	task client.Task
	// stop kills and deletes the task, and the container with its snapshot.
	stop func(context.Context) error
	// created is how long creating the container took.
	created time.Duration
}

// runContainer creates container id from image on the cocoon snapshotter
// and runtime, asking for mode, and starts its task with args (benchArgs
// if none).
func runContainer(ctx context.Context, cl *client.Client, image client.Image, id string, mode hypervisor.Mode,
	ioc cio.Creator, args ...string) (*runningContainer, error) {
	if len(args) == 0 {
		args = benchArgs
	}
	start := time.Now()
	ctr, err := cl.NewContainer(ctx, id,
		client.WithImage(image),
		client.WithSnapshotter(devstack.Snapshotter),
		client.WithNewSnapshot(id, image),
		client.WithRuntime(devstack.Runtime, nil),
		client.WithNewSpec(oci.WithProcessArgs(args...), oci.WithHostname(id),
			oci.WithAnnotations(map[string]string{restore.AnnotationMode: string(mode)})),
	)
	if err != nil {
		return nil, fmt.Errorf("create container %s: %w", id, err)
	}
	rc := &runningContainer{created: time.Since(start)}
	deleteCtr := func(ctx context.Context) error { return ctr.Delete(ctx, client.WithSnapshotCleanup) }
	if rc.task, err = ctr.NewTask(ctx, ioc); err != nil {
		return nil, errors.Join(fmt.Errorf("create task %s: %w", id, err), deleteCtr(context.WithoutCancel(ctx)))
	}
	rc.stop = func(ctx context.Context) error {
		_, err := rc.task.Delete(ctx, client.WithProcessKill)
		return errors.Join(err, deleteCtr(ctx))
	}
	if err := rc.task.Start(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("start task %s: %w", id, err), rc.stop(context.WithoutCancel(ctx)))
	}
	return rc, nil
}

// bundleDir is where containerd keeps task id's bundle (and the shim its
// restore report).
func bundleDir(stack *devstack.Stack, id string) string {
	return filepath.Join(stack.State, "io.containerd.runtime.v2.task", stack.Namespace, id)
}

func (p *shimPath) close() error {
	return p.stack.Close()
}
