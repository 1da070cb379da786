package stackrun

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
	"github.com/cocoonstack/containerd-shim-cocoon/restore"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
)

// Container is one container to create and start.
type Container struct {
	ID          string
	Image       client.Image
	Snapshotter string
	Runtime     string
	// RuntimeOptions, when set, go to the runtime (a cocoon config file:
	// *runtimeoptions.Options).
	RuntimeOptions any
	Spec           []oci.SpecOpts
	IO             cio.Creator // cio.NullIO when nil
}

// Cocoon is container id from image on the cocoon snapshotter and runtime,
// asking for restore mode with the annotation, running args with id as its
// hostname. opts shape the spec first (such as oci.WithImageConfig), so
// they do not replace the args.
func Cocoon(id string, image client.Image, mode hypervisor.Mode, args []string, opts ...oci.SpecOpts) Container {
	spec := slices.Concat(opts, []oci.SpecOpts{oci.WithProcessArgs(args...), oci.WithHostname(id),
		oci.WithAnnotations(map[string]string{restore.AnnotationMode: string(mode)})})
	return Container{ID: id, Image: image, Snapshotter: devstack.Snapshotter, Runtime: devstack.Runtime, Spec: spec}
}

// Running is a container whose task runs.
type Running struct {
	Task client.Task
	// Created is how long creating the container (containerd's metadata
	// and its snapshot) took.
	Created time.Duration
	// Stop kills and deletes the task, and the container with its snapshot.
	Stop func(context.Context) error
}

// Run creates c and starts its task. On error nothing is left.
func Run(ctx context.Context, cl *client.Client, c Container) (*Running, error) {
	start := time.Now()
	ctr, err := cl.NewContainer(ctx, c.ID,
		client.WithImage(c.Image),
		client.WithSnapshotter(c.Snapshotter),
		client.WithNewSnapshot(c.ID, c.Image),
		client.WithRuntime(c.Runtime, c.RuntimeOptions),
		client.WithNewSpec(c.Spec...),
	)
	if err != nil {
		return nil, fmt.Errorf("create container %s: %w", c.ID, err)
	}
	r := &Running{Created: time.Since(start)}
	deleteCtr := func(ctx context.Context) error { return ctr.Delete(ctx, client.WithSnapshotCleanup) }
	ioc := c.IO
	if ioc == nil {
		ioc = cio.NullIO
	}
	if r.Task, err = ctr.NewTask(ctx, ioc); err != nil {
		return nil, errors.Join(fmt.Errorf("create task %s: %w", c.ID, err), deleteCtr(context.WithoutCancel(ctx)))
	}
	r.Stop = func(ctx context.Context) error {
		_, err := r.Task.Delete(ctx, client.WithProcessKill)
		return errors.Join(err, deleteCtr(ctx))
	}
	if err := r.Task.Start(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("start task %s: %w", c.ID, err), r.Stop(context.WithoutCancel(ctx)))
	}
	return r, nil
}

// ReadReport reads the restore report the cocoon shim wrote into task id's
// bundle, which goes with the task.
func ReadReport(stack *devstack.Stack, id string) (*state.Report, error) {
	dir := filepath.Join(stack.State, "io.containerd.runtime.v2.task", stack.Namespace, id)
	rep, err := state.ReadReport(dir)
	if err != nil {
		return nil, fmt.Errorf("restore report of %s: %w", id, err)
	}
	return rep, nil
}
