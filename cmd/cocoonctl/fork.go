package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/defaults"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/docker/go-units"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// fork and hibernate write a running task's VM as one new chain link
// through containerd's task checkpoint API (the shim writes the link into
// the directory containerd gives it, containerd stores the directory as
// content), then register an image made of the task's image's layers,
// referenced, plus the link as a new layer, unpacked into the container's
// snapshotter and ready for ctr run, export and push. Hibernate then stops
// the task. Everything is written under one lease and the image is created
// last, so a failure leaves nothing in the image store.
func init() {
	register(command{name: "fork", summary: "write a running task as a new image: its image's chain + one diff link", flags: func(fs *flag.FlagSet) action { return forkFlags(fs, false) }})
	register(command{name: "hibernate", summary: "fork a running task into an image, then stop it", flags: func(fs *flag.FlagSet) action { return forkFlags(fs, true) }})
}

// runtimeType is the containerd runtime a forkable task runs on.
const runtimeType = "io.containerd.cocoon.v2"

type forkOptions struct {
	address, namespace, image string
	hibernate                 bool
}

func forkFlags(fs *flag.FlagSet, hibernate bool) action {
	o := forkOptions{hibernate: hibernate}
	ns := os.Getenv(namespaces.NamespaceEnvVar)
	if ns == "" {
		ns = namespaces.Default
	}
	fs.StringVar(&o.address, "address", defaults.DefaultAddress, "containerd's gRPC `socket`")
	fs.StringVar(&o.namespace, "namespace", ns, "containerd `namespace` (default $"+namespaces.NamespaceEnvVar+", else "+namespaces.Default+")")
	fs.StringVar(&o.image, "image", "", "`name` of the image to create, e.g. example.com/app:forked (required)")
	return func(ctx context.Context, e env, args []string) error {
		switch {
		case o.image == "":
			return errors.New("--image is required: the name of the image to create")
		case len(args) != 1:
			return fmt.Errorf("want one TASK argument (the container ID), got %d", len(args))
		}
		return fork(ctx, e.out, o, args[0])
	}
}

func fork(ctx context.Context, out io.Writer, o forkOptions, id string) error {
	if _, err := os.Stat(o.address); err != nil {
		return fmt.Errorf("containerd socket: %w (--address)", err)
	}
	cl, err := client.New(o.address, client.WithDefaultNamespace(o.namespace))
	if err != nil {
		return fmt.Errorf("connect to containerd at %s: %w", o.address, err)
	}
	defer cl.Close()
	ctx = namespaces.WithNamespace(ctx, o.namespace)
	ctx, done, err := cl.WithLease(ctx)
	if err != nil {
		return fmt.Errorf("take a lease: %w", err)
	}
	// The lease keeps what the fork writes until the image references it;
	// ending it lets containerd collect the rest (or all, on failure).
	defer done(context.WithoutCancel(ctx))
	f := &forker{cl: cl, o: o, id: id}
	res, err := f.run(ctx)
	if err != nil {
		return err
	}
	verb := "forked"
	if o.hibernate {
		verb = "hibernated"
	}
	fmt.Fprintf(out, "%s %s into %s: %s link %s (%s of memory, %d layers), checkpoint %s\n",
		verb, id, o.image, res.link.Kind, res.link.ID(), units.BytesSize(float64(res.link.Memory.DataBytes)),
		res.layers, res.checkpoint.Round(time.Millisecond))
	return nil
}

// forker forks one task.
type forker struct {
	cl *client.Client
	o  forkOptions
	id string
}

// forkResult is what a fork made.
type forkResult struct {
	link       *chain.Link
	layers     int
	checkpoint time.Duration
}

func (f *forker) run(ctx context.Context) (*forkResult, error) {
	container, task, err := f.runningTask(ctx)
	if err != nil {
		return nil, err
	}
	info, err := container.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", f.id, err)
	}
	if info.Runtime.Name != runtimeType {
		return nil, fmt.Errorf("container %s runs on %q, not %s: only cocoon tasks fork", f.id, info.Runtime.Name, runtimeType)
	}
	parent, err := loadChainImage(ctx, f.cl, info.Image)
	if err != nil {
		return nil, err
	}
	if _, err := f.cl.ImageService().Get(ctx, f.o.image); err == nil {
		return nil, fmt.Errorf("image %s already exists: %w", f.o.image, errdefs.ErrAlreadyExists)
	} else if !errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("look up image %s: %w", f.o.image, err)
	}
	if f.o.hibernate {
		// Paused, the guest does nothing between the snapshot and the stop;
		// a failure before the stop resumes it as if nothing happened.
		if err := task.Pause(ctx); err != nil {
			return nil, fmt.Errorf("pause task %s: %w", f.id, err)
		}
	}
	res, err := f.forkInto(ctx, parent, info.Snapshotter)
	if f.o.hibernate {
		err = f.stop(ctx, task, err)
	}
	if err != nil {
		return nil, err
	}
	return res, nil
}

// runningTask finds the container id's task and checks it runs: a paused
// task stays paused for its owner to resume, and nothing else can be
// snapshotted.
func (f *forker) runningTask(ctx context.Context) (client.Container, client.Task, error) {
	container, err := f.cl.LoadContainer(ctx, f.id)
	if errdefs.IsNotFound(err) {
		return nil, nil, fmt.Errorf("no container %q in namespace %q: %w", f.id, f.o.namespace, err)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("load container %s: %w", f.id, err)
	}
	task, err := container.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return nil, nil, fmt.Errorf("container %s has no task: start it first: %w", f.id, err)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("task %s: %w", f.id, err)
	}
	st, err := task.Status(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("status of task %s: %w", f.id, err)
	}
	switch st.Status {
	case client.Running:
		return container, task, nil
	case client.Paused:
		return nil, nil, fmt.Errorf("task %s is paused: resume it to fork it (a fork pauses it only while it snapshots): %w", f.id, errdefs.ErrFailedPrecondition)
	default:
		return nil, nil, fmt.Errorf("task %s is %s, want running: %w", f.id, st.Status, errdefs.ErrFailedPrecondition)
	}
}

// forkInto checkpoints the task and registers the image.
func (f *forker) forkInto(ctx context.Context, parent *chainImage, snapshotter string) (*forkResult, error) {
	req := &tasksapi.CheckpointTaskRequest{ContainerID: f.id}
	began := time.Now()
	resp, err := f.cl.TaskService().Checkpoint(ctx, req)
	took := time.Since(began)
	if err != nil {
		return nil, fmt.Errorf("checkpoint task %s: %w", f.id, errgrpc.ToNative(err))
	}
	dir, err := os.MkdirTemp("", "cocoon-fork-")
	if err != nil {
		return nil, fmt.Errorf("create link dir: %w", err)
	}
	defer os.RemoveAll(dir)
	if err := extractCheckpoint(ctx, f.cl.ContentStore(), resp.Descriptors, dir); err != nil {
		return nil, err
	}
	link, layers, err := registerFork(ctx, f.cl, parent, dir, f.o.image, snapshotter)
	if err != nil {
		return nil, err
	}
	return &forkResult{link: link, layers: layers, checkpoint: took}, nil
}

// stop ends a hibernated task once its image exists, or resumes it when
// the fork failed (err), returning the outcome.
func (f *forker) stop(ctx context.Context, task client.Task, err error) error {
	if err != nil {
		if rerr := task.Resume(ctx); rerr != nil {
			return errors.Join(err, fmt.Errorf("resume task %s after the failed hibernate: %w", f.id, rerr))
		}
		return err
	}
	exited, err := task.Wait(ctx)
	if err != nil {
		return fmt.Errorf("wait for task %s: %w", f.id, err)
	}
	if err := task.Kill(ctx, unix.SIGKILL); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("stop hibernated task %s: %w", f.id, err)
	}
	select {
	case <-exited:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for hibernated task %s to stop: %w", f.id, ctx.Err())
	}
}
