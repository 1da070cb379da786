// Package snapshotter is cocoon's containerd snapshotter. It stores snapshot
// chain links unpacked from OCI layers, flattens each chain's memory once per
// node, and stages that flat file into container snapshots by hard link so
// that every clone of a chain shares one inode and its page cache.
//
// Layout under root:
//
//	metadata.db        containerd's snapshot metastore (bbolt)
//	snapshots/<id>/    one dir per snapshot: a link (unpack, then committed
//	                   read-only) or a staging dir (memory, state files, chain.json)
//	flat/<link id>     flattened chain memory, 0444, keyed by the top link's ID
//	boot_id            the boot the snapshotter last started in
package snapshotter

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"github.com/containerd/continuity/fs"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// Opt configures a Snapshotter.
type Opt func(*config)

type config struct {
	flatCacheSize int64
	flatten       flattenFunc
	remove        removeFunc
	bootID        func() (string, error)
}

// WithFlatCacheSize sets the byte budget (allocated bytes on disk) for
// flattened memory files; 0 means unlimited.
func WithFlatCacheSize(n int64) Opt {
	return func(c *config) { c.flatCacheSize = n }
}

// Snapshotter implements snapshots.Snapshotter and snapshots.Cleaner.
type Snapshotter struct {
	root string
	ms   *storage.MetaStore
	flat *flatCache

	// dirs orders reconcile (write) against creates and removes (read),
	// which rename dirs inside metadata transactions reconcile cannot see.
	dirs sync.RWMutex
}

var (
	_ snapshots.Snapshotter = (*Snapshotter)(nil)
	_ snapshots.Cleaner     = (*Snapshotter)(nil)
)

// New opens (or creates) a snapshotter rooted at root. It removes temp
// files a crash left behind and staging dirs the metadata does not know,
// and re-stages the staged snapshots after a reboot.
func New(root string, opts ...Opt) (*Snapshotter, error) {
	cfg := config{flatten: chain.Flatten, remove: os.Remove, bootID: readBootID}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.flatCacheSize < 0 {
		return nil, fmt.Errorf("flat cache size %d: want 0 (unlimited) or a positive byte count", cfg.flatCacheSize)
	}
	for _, d := range []string{root, filepath.Join(root, "snapshots"), filepath.Join(root, "flat")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("create %s: %w", d, err)
		}
	}
	ms, err := storage.NewMetaStore(filepath.Join(root, "metadata.db"))
	if err != nil {
		return nil, fmt.Errorf("open metadata: %w", err)
	}
	s := &Snapshotter{root: root, ms: ms}
	s.flat, err = openFlatCache(filepath.Join(root, "flat"), cfg.flatCacheSize, cfg.flatten, cfg.remove)
	if err == nil {
		err = s.reconcile(context.Background(), true)
	}
	if err == nil {
		err = s.restageAfterReboot(context.Background(), cfg.bootID)
	}
	if err == nil {
		err = s.dropOrphans(context.Background())
	}
	if err != nil {
		ms.Close()
		return nil, err
	}
	// The first pass removes what reconcile unpinned and dropOrphans marked.
	s.flat.startEvictor(context.Background())
	s.flat.requestEvict()
	return s, nil
}

// Stat returns the info of an active, view or committed snapshot.
func (s *Snapshotter) Stat(ctx context.Context, key string) (info snapshots.Info, err error) {
	err = s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		_, info, _, err = storage.GetInfo(ctx, key)
		return err
	})
	return info, err
}

// Update changes the labels of a snapshot.
func (s *Snapshotter) Update(ctx context.Context, info snapshots.Info, fieldpaths ...string) (out snapshots.Info, err error) {
	err = s.ms.WithTransaction(ctx, true, func(ctx context.Context) error {
		out, err = storage.UpdateInfo(ctx, info, fieldpaths...)
		return err
	})
	return out, err
}

// Usage reports the disk usage of a snapshot; for an active one it is
// measured now, for a committed one it was recorded at Commit. A staged
// memory hard link counts in full, as du would count it.
func (s *Snapshotter) Usage(ctx context.Context, key string) (snapshots.Usage, error) {
	var (
		id    string
		info  snapshots.Info
		usage snapshots.Usage
	)
	err := s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		var err error
		id, info, usage, err = storage.GetInfo(ctx, key)
		return err
	})
	if err != nil {
		return snapshots.Usage{}, err
	}
	if info.Kind == snapshots.KindActive {
		du, err := fs.DiskUsage(ctx, s.dir(id))
		if err != nil {
			return snapshots.Usage{}, fmt.Errorf("measure snapshot %s: %w", key, err)
		}
		usage = snapshots.Usage(du)
	}
	return usage, nil
}

// Mounts returns the bind mount of an active or view snapshot's dir.
func (s *Snapshotter) Mounts(ctx context.Context, key string) ([]mount.Mount, error) {
	var snap storage.Snapshot
	err := s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		var err error
		snap, err = storage.GetSnapshot(ctx, key)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("get mounts of %s: %w", key, err)
	}
	return s.mounts(snap), nil
}

// Walk calls fn for every snapshot matching the filters.
func (s *Snapshotter) Walk(ctx context.Context, fn snapshots.WalkFunc, filters ...string) error {
	return s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		return storage.WalkInfo(ctx, fn, filters...)
	})
}

// Close waits for a running eviction pass to stop and closes the metadata
// store.
func (s *Snapshotter) Close() error {
	s.flat.closeEvictor()
	return s.ms.Close()
}

func (s *Snapshotter) dir(id string) string {
	return filepath.Join(s.root, "snapshots", id)
}

func (s *Snapshotter) mounts(snap storage.Snapshot) []mount.Mount {
	mode := "rw"
	if snap.Kind == snapshots.KindView {
		mode = "ro"
	}
	return []mount.Mount{{
		Type:    "bind",
		Source:  s.dir(snap.ID),
		Options: []string{"rbind", mode},
	}}
}
