// Package baseimage stages the base snapshot image a task restores when its
// own image is an ordinary OCI image: a container snapshot of the base
// chain in the cocoon snapshotter, taken through containerd's API under a
// lease named after the task, so containerd's garbage collector keeps it
// for the task's life and `shim delete` can find it after a crash.
package baseimage

import (
	"context"
	"errors"
	"fmt"
	"sync"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/image-spec/identity"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
)

// leasePrefix names the lease that keeps a task's base snapshot from
// containerd's garbage collector; the task id follows.
const leasePrefix = "cocoon-base-"

// Snapshot is the base image staged for one task.
type Snapshot struct {
	client      *containerd.Client
	namespace   string
	snapshotter string
	key         string
	// Image is the base image the snapshot is of.
	Image string
	// Dir is the staged chain to restore from, Staged that chain as read
	// when it was checked (the restore uses it rather than read it again).
	Dir    string
	Staged *chain.Staged
}

// Clients keeps one containerd client per address for the shim's life.
type Clients struct {
	mu sync.Mutex
	m  map[string]*containerd.Client
}

// Get returns the client for address, connecting the first time.
func (c *Clients) Get(address string) (*containerd.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cl, ok := c.m[address]; ok {
		return cl, nil
	}
	cl, err := containerd.New(address)
	if err != nil {
		return nil, fmt.Errorf("connect to containerd at %s: %w", address, err)
	}
	if c.m == nil {
		c.m = map[string]*containerd.Client{}
	}
	c.m[address] = cl
	return cl, nil
}

// Stage prepares a snapshot of image (unpacking it into snapshotter first
// if needed) for task id and returns where it is staged; opts are the
// lease's. On error nothing is left.
func Stage(ctx context.Context, client *containerd.Client, namespace, snapshotter, image, id string, opts ...leases.Opt) (*Snapshot, error) {
	ctx = namespaces.WithNamespace(ctx, namespace)
	img, err := client.GetImage(ctx, image)
	if err != nil {
		return nil, fmt.Errorf("base image %s (restore.base_image): %w", image, err)
	}
	diffIDs, err := img.RootFS(ctx)
	if err != nil {
		return nil, fmt.Errorf("base image %s layers: %w", image, err)
	}
	parent := identity.ChainID(diffIDs).String()
	b, err := stage(ctx, client, namespace, snapshotter, parent, id, opts, func(ctx context.Context, lease, key string) ([]mount.Mount, error) {
		return prepare(ctx, client, img, snapshotter, lease, key, parent)
	})
	if err != nil {
		return nil, fmt.Errorf("base image %s: %w", image, err)
	}
	b.Image = image
	return b, nil
}

// StageParent prepares, as Stage does, a snapshot on parent, a snapshot
// image's top layer already in snapshotter (a running container's).
func StageParent(ctx context.Context, client *containerd.Client, namespace, snapshotter, parent, id string, opts ...leases.Opt) (*Snapshot, error) {
	ctx = namespaces.WithNamespace(ctx, namespace)
	return stage(ctx, client, namespace, snapshotter, parent, id, opts, func(ctx context.Context, lease, key string) ([]mount.Mount, error) {
		return client.SnapshotService(snapshotter).Prepare(leases.WithLease(ctx, lease), key, parent)
	})
}

// stage makes id's lease and has prep prepare its snapshot under it,
// then reads the staged chain. On error nothing is left.
func stage(ctx context.Context, client *containerd.Client, namespace, snapshotter, parent, id string, opts []leases.Opt,
	prep func(ctx context.Context, lease, key string) ([]mount.Mount, error)) (_ *Snapshot, retErr error) {
	b := &Snapshot{client: client, namespace: namespace, snapshotter: snapshotter, key: Key(id)}
	lease, err := client.LeasesService().Create(ctx, append([]leases.Opt{leases.WithID(b.key)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("lease for the base snapshot of %s: %w", id, err)
	}
	defer func() {
		if retErr != nil {
			retErr = errors.Join(retErr, b.Release())
		}
	}()
	mounts, err := prep(ctx, lease.ID, b.key)
	if err != nil {
		return nil, fmt.Errorf("stage %s in snapshotter %s: %w", parent, snapshotter, err)
	}
	if b.Dir, err = bindSource(mounts); err != nil {
		return nil, fmt.Errorf("not a cocoon snapshot image (its layers must be chain links): %w", err)
	}
	if b.Staged, err = chain.OpenStaged(b.Dir); err != nil {
		return nil, fmt.Errorf("not a cocoon snapshot image (its layers must be chain links): %w: %w", err, errdefs.ErrInvalidArgument)
	}
	return b, nil
}

// prepare stages key, under lease, on the base image's top layer, parent.
// The layers are unpacked once per node: asking first would cost every
// restore a round of content reads and a snapshotter stat, so a missing
// parent is what says they are not there yet. The unpacked layers are the
// image's, not the task's lease's.
func prepare(ctx context.Context, client *containerd.Client, img containerd.Image, snapshotter, lease, key, parent string) ([]mount.Mount, error) {
	sn := client.SnapshotService(snapshotter)
	leased := leases.WithLease(ctx, lease)
	mounts, err := sn.Prepare(leased, key, parent)
	if !errdefs.IsNotFound(err) {
		return mounts, err
	}
	log.G(ctx).WithFields(log.Fields{"image": img.Name(), "snapshotter": snapshotter}).Info("unpacking base image")
	if err := img.Unpack(ctx, snapshotter); err != nil {
		return nil, fmt.Errorf("unpack base image %s into %s: %w", img.Name(), snapshotter, err)
	}
	return sn.Prepare(leased, key, parent)
}

// bindSource is the directory a staged chain's single bind mount shows.
func bindSource(mounts []mount.Mount) (string, error) {
	if len(mounts) != 1 || (mounts[0].Type != "bind" && mounts[0].Type != "rbind") {
		return "", fmt.Errorf("its snapshot mounts as %d %s mount(s), not as a staged chain (one bind mount): %w", len(mounts), mountType(mounts), errdefs.ErrInvalidArgument)
	}
	return mounts[0].Source, nil
}

// Record names the snapshot in the task record.
func (b *Snapshot) Record() *state.Base {
	return &state.Base{Namespace: b.namespace, Snapshotter: b.snapshotter, Key: b.key}
}

// Key is the snapshot key and lease id of task id's base snapshot.
func Key(id string) string { return leasePrefix + id }

func mountType(mounts []mount.Mount) string {
	if len(mounts) == 0 {
		return "no"
	}
	return mounts[0].Type
}

// Release removes the base snapshot and its lease; it is idempotent.
func (b *Snapshot) Release() error {
	if b == nil {
		return nil
	}
	return Release(context.Background(), b.client, b.namespace, b.snapshotter, b.key)
}

// Release removes the base snapshot key and its lease, whatever of them
// exists: also what `shim delete` calls after a crash.
func Release(ctx context.Context, client *containerd.Client, namespace, snapshotter, key string) error {
	ctx = namespaces.WithNamespace(ctx, namespace)
	var errs []error
	if err := client.SnapshotService(snapshotter).Remove(ctx, key); err != nil && !errdefs.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("remove base snapshot %s: %w", key, err))
	}
	if err := client.LeasesService().Delete(ctx, leases.Lease{ID: key}); err != nil && !errdefs.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("delete lease %s: %w", key, err))
	}
	return errors.Join(errs...)
}
