package snapshotter

import (
	"context"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/rpcerr"
)

// wire is the snapshotter as the gRPC service sees it: every error
// flattened by rpcerr, so a %w: %w chain reads once on the client.
type wire struct{ s snapshots.Snapshotter }

var (
	_ snapshots.Snapshotter = wire{}
	_ snapshots.Cleaner     = wire{}
)

func (w wire) Stat(ctx context.Context, key string) (snapshots.Info, error) {
	info, err := w.s.Stat(ctx, key)
	return info, rpcerr.Flatten(err)
}

func (w wire) Update(ctx context.Context, info snapshots.Info, fieldpaths ...string) (snapshots.Info, error) {
	info, err := w.s.Update(ctx, info, fieldpaths...)
	return info, rpcerr.Flatten(err)
}

func (w wire) Usage(ctx context.Context, key string) (snapshots.Usage, error) {
	u, err := w.s.Usage(ctx, key)
	return u, rpcerr.Flatten(err)
}

func (w wire) Mounts(ctx context.Context, key string) ([]mount.Mount, error) {
	m, err := w.s.Mounts(ctx, key)
	return m, rpcerr.Flatten(err)
}

func (w wire) Prepare(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	m, err := w.s.Prepare(ctx, key, parent, opts...)
	return m, rpcerr.Flatten(err)
}

func (w wire) View(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	m, err := w.s.View(ctx, key, parent, opts...)
	return m, rpcerr.Flatten(err)
}

func (w wire) Commit(ctx context.Context, name, key string, opts ...snapshots.Opt) error {
	return rpcerr.Flatten(w.s.Commit(ctx, name, key, opts...))
}

func (w wire) Remove(ctx context.Context, key string) error {
	return rpcerr.Flatten(w.s.Remove(ctx, key))
}

func (w wire) Walk(ctx context.Context, fn snapshots.WalkFunc, filters ...string) error {
	return rpcerr.Flatten(w.s.Walk(ctx, fn, filters...))
}

func (w wire) Close() error { return rpcerr.Flatten(w.s.Close()) }

// Cleanup runs the snapshotter's cleanup when it has one.
func (w wire) Cleanup(ctx context.Context) error {
	if c, ok := w.s.(snapshots.Cleaner); ok {
		return rpcerr.Flatten(c.Cleanup(ctx))
	}
	return nil
}
