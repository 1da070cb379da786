// Package snapshotter is cocoon's containerd snapshotter. It stores snapshot
// chain links unpacked from OCI layers, flattens each chain's memory once per
// node, and stages that flat file into container snapshots by hard link so
// that every clone of a chain shares one inode and its page cache. Ordinary
// OCI layers (pause, busybox, any image) are stored and mounted as
// containerd's overlay snapshotter does; a container on them also gets the
// layers merged into one read-only erofs image, built once per layer chain
// and staged by hard link under the same rules.
//
// Layout under root:
//
//	metadata.db          containerd's snapshot metastore (bbolt)
//	snapshots/<id>/      one dir per snapshot: a link (unpack, then committed
//	                     read-only), a staging dir (memory, state files,
//	                     chain.json), an ordinary layer without a parent (its
//	                     files), or an overlay snapshot on ordinary layers
//	                     (fs/ upper, work/, and for a container rootfs.img and
//	                     rootfs.json)
//	flat/<link id>       flattened chain memory, 0444, keyed by the top link's ID
//	flat/erofs-<id>-<t>  rootfs image of the ordinary layers topped by snapshot
//	                     id (committed at t, in ns), 0444
//	mnt/                 private mount points of image builds
//	boot_id              the boot the snapshotter last started in
package snapshotter

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"sync"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"github.com/containerd/continuity/fs"
	"github.com/containerd/log"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// Opt configures a Snapshotter.
type Opt func(*config)

type config struct {
	flatCacheSize int64
	maxRootfsSize int64
	flatten       flattenFunc
	buildImage    imageFunc // nil: mkfs.erofs
	remove        removeFunc
	bootID        func() (string, error)
}

// WithMaxRootfsSize bounds the files of an ordinary image's layer chain
// (their sizes, holes included) that are converted into a rootfs image; 0
// means unlimited. A layer can hold a sparse file of any size, which the
// image would store in full.
func WithMaxRootfsSize(n int64) Opt {
	return func(c *config) { c.maxRootfsSize = n }
}

// WithFlatCacheSize sets the byte budget (allocated bytes on disk) for
// flattened memory files and rootfs images; 0 means unlimited.
func WithFlatCacheSize(n int64) Opt {
	return func(c *config) { c.flatCacheSize = n }
}

// Snapshotter implements snapshots.Snapshotter and snapshots.Cleaner.
type Snapshotter struct {
	root        string
	ms          *storage.MetaStore
	flat        *flatCache
	flatten     flattenFunc
	buildImage  imageFunc
	overlayOpts []string // containerd overlay's default mount options

	// dirs orders reconcile (write) against creates and removes (read),
	// which rename dirs inside metadata transactions reconcile cannot see.
	dirs sync.RWMutex
}

var (
	_ snapshots.Snapshotter = (*Snapshotter)(nil)
	_ snapshots.Cleaner     = (*Snapshotter)(nil)
)

// New opens (or creates) a snapshotter rooted at root. It removes temp
// files and build mounts a crash left behind and staging dirs the metadata
// does not know, and re-stages the staged snapshots after a reboot.
func New(ctx context.Context, root string, opts ...Opt) (*Snapshotter, error) {
	cfg := config{flatten: chain.FlattenUnsynced, remove: os.Remove, bootID: readBootID}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.flatCacheSize < 0 {
		return nil, fmt.Errorf("flat cache size %d: want 0 (unlimited) or a positive byte count", cfg.flatCacheSize)
	}
	for _, d := range []string{root, filepath.Join(root, "snapshots"), filepath.Join(root, "flat"), filepath.Join(root, "mnt")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("create %s: %w", d, err)
		}
	}
	if err := cleanBuildMounts(ctx, filepath.Join(root, "mnt")); err != nil {
		return nil, err
	}
	ms, err := storage.NewMetaStore(filepath.Join(root, "metadata.db"))
	if err != nil {
		return nil, fmt.Errorf("open metadata: %w", err)
	}
	s := &Snapshotter{root: root, ms: ms, flatten: cfg.flatten, buildImage: cfg.buildImage, overlayOpts: overlayOptions(root)}
	if s.buildImage == nil {
		b := imageBuilder{mntDir: filepath.Join(root, "mnt"), layerDir: filepath.Join(root, "snapshots"), options: s.overlayOpts, maxSize: cfg.maxRootfsSize}
		s.buildImage = b.build
		if _, err := exec.LookPath(mkfsErofs); err != nil {
			log.L.WithError(err).Warn("containers on ordinary image layers cannot be prepared without " + mkfsErofs + " (Debian: erofs-utils)")
		}
	}
	s.flat, err = openFlatCache(filepath.Join(root, "flat"), cfg.flatCacheSize, cfg.remove)
	if err == nil {
		err = s.reconcile(ctx, true)
	}
	if err == nil {
		err = s.restageAfterReboot(ctx, cfg.bootID)
	}
	if err == nil {
		err = s.dropOrphans(ctx)
	}
	if err != nil {
		ms.Close()
		return nil, err
	}
	// The first pass removes what reconcile unpinned and dropOrphans marked.
	s.flat.startEvictor(context.WithoutCancel(ctx))
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

// Update changes the labels of a snapshot, except labelKind, which keeps
// its value: containerd replaces all of a snapshot's labels with its own
// when a client sets them.
func (s *Snapshotter) Update(ctx context.Context, info snapshots.Info, fieldpaths ...string) (out snapshots.Info, err error) {
	err = s.ms.WithTransaction(ctx, true, func(ctx context.Context) error {
		_, old, _, err := storage.GetInfo(ctx, info.Name)
		if err != nil {
			return err
		}
		if out, err = storage.UpdateInfo(ctx, info, fieldpaths...); err != nil {
			return err
		}
		was, had := old.Labels[labelKind]
		if is, has := out.Labels[labelKind]; is == was && has == had {
			return nil
		}
		labels := maps.Clone(out.Labels)
		if labels == nil {
			labels = map[string]string{}
		}
		delete(labels, labelKind)
		if had {
			labels[labelKind] = was
		}
		out, err = storage.UpdateInfo(ctx, snapshots.Info{Name: info.Name, Labels: labels}, "labels")
		return err
	})
	return out, err
}

// Usage reports the disk usage of a snapshot; for an active one it is
// measured now, for a committed one it was recorded at Commit. A staged
// memory hard link counts in full, as du would count it; an overlay on
// ordinary layers counts its upper dir, as containerd's overlay does.
func (s *Snapshotter) Usage(ctx context.Context, key string) (snapshots.Usage, error) {
	var (
		st    snapState
		info  snapshots.Info
		usage snapshots.Usage
	)
	err := s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		var err error
		if _, info, usage, err = storage.GetInfo(ctx, key); err != nil || info.Kind != snapshots.KindActive {
			return err
		}
		st, err = getState(ctx, key)
		return err
	})
	if err != nil {
		return snapshots.Usage{}, err
	}
	if info.Kind == snapshots.KindActive {
		dir := s.dir(st.snap.ID)
		if st.overlay {
			dir = filepath.Join(dir, upperDirName)
		}
		du, err := fs.DiskUsage(ctx, dir)
		if err != nil {
			return snapshots.Usage{}, fmt.Errorf("measure snapshot %s: %w", key, err)
		}
		usage = snapshots.Usage(du)
	}
	return usage, nil
}

// Mounts returns the mounts of an active or view snapshot.
func (s *Snapshotter) Mounts(ctx context.Context, key string) ([]mount.Mount, error) {
	var st snapState
	err := s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		var err error
		st, err = getState(ctx, key)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("get mounts of %s: %w", key, err)
	}
	return s.mounts(st), nil
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
