package snapshotter

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"github.com/containerd/errdefs"
)

// Prepare creates an active snapshot. With the snapshot.ref label (or an
// unpack key) or no parent it is a dir for containerd's applier to unpack a
// layer into: an empty dir, or an overlay on an ordinary parent layer. On a
// committed parent it is a container's: a staged chain on links, an overlay
// with the layers' staged filesystem image on ordinary layers.
func (s *Snapshotter) Prepare(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	return s.create(ctx, snapshots.KindActive, key, parent, opts)
}

// View creates a read-only snapshot of parent: a staged chain on links, the
// layers' read-only mount on ordinary layers, an empty dir on nothing.
func (s *Snapshotter) View(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	return s.create(ctx, snapshots.KindView, key, parent, opts)
}

// create fills a temp dir first and renames it into place inside the
// metadata transaction, so a crash leaves either nothing or a temp dir that
// the next start removes.
func (s *Snapshotter) create(ctx context.Context, kind snapshots.Kind, key, parent string, opts []snapshots.Opt) (_ []mount.Mount, err error) {
	unpack, err := isUnpack(kind, key, opts)
	if err != nil {
		return nil, err
	}
	if err := s.checkNew(ctx, key); err != nil {
		return nil, err
	}
	var lc layerChain
	if parent != "" {
		if lc, err = s.resolveChain(ctx, parent); err != nil {
			return nil, fmt.Errorf("create snapshot %s: %w", key, err)
		}
	}
	tmp, err := os.MkdirTemp(filepath.Join(s.root, "snapshots"), tempDirPrefix)
	if err != nil {
		return nil, fmt.Errorf("create snapshot dir: %w", err)
	}
	var cached string
	defer func() {
		removeDir(ctx, tmp)
		if err != nil && cached != "" {
			s.unpinned(ctx, parent, cached)
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, fmt.Errorf("chmod snapshot dir: %w", err)
	}
	if cached, err = s.fill(ctx, kind, unpack, lc, tmp); err != nil {
		return nil, fmt.Errorf("stage %s on %s: %w", key, parent, err)
	}

	s.dirs.RLock()
	defer s.dirs.RUnlock()
	var (
		snap  storage.Snapshot
		moved string
	)
	err = s.ms.WithTransaction(ctx, true, func(ctx context.Context) error {
		var err error
		if snap, err = storage.CreateSnapshot(ctx, kind, key, parent, opts...); err != nil {
			return fmt.Errorf("create snapshot %s: %w", key, err)
		}
		if err := os.Rename(tmp, s.dir(snap.ID)); err != nil {
			return fmt.Errorf("publish snapshot dir %s: %w", key, err)
		}
		moved = s.dir(snap.ID)
		return nil
	})
	if err != nil {
		if moved != "" {
			removeDir(ctx, moved)
		}
		return nil, err
	}
	return s.mounts(snapState{snap: snap, overlay: lc.ordinary}), nil
}

// fill makes dir what a new snapshot on the chain lc needs and returns the
// name of the flat cache file it staged, if any (even on error).
func (s *Snapshotter) fill(ctx context.Context, kind snapshots.Kind, unpack bool, lc layerChain, dir string) (string, error) {
	switch {
	case len(lc.ids) == 0:
		return "", nil // an empty dir
	case lc.ordinary:
		if err := makeOverlayDirs(dir, kind, s.filesDir(lc.ids[0], len(lc.ids) > 1)); err != nil {
			return "", err
		}
		if kind != snapshots.KindActive || unpack {
			return "", nil
		}
		return s.stageRootfs(ctx, lc, dir)
	case unpack:
		return "", nil // a link on a link: an empty dir
	default:
		return s.stageLinks(ctx, lc, dir)
	}
}

// unpinned follows a failed create that staged the flat file name from the
// chain topped by parent. If parent is gone, its Remove ran while the file
// was being built or staged and may have found nothing to drop: drop it
// now, or it would outlive its chain. Either way the failed create's hard
// link is gone, which may let eviction remove the file.
func (s *Snapshotter) unpinned(ctx context.Context, parent, name string) {
	err := s.ms.WithTransaction(context.WithoutCancel(ctx), false, func(ctx context.Context) error {
		_, _, _, err := storage.GetInfo(ctx, parent)
		return err
	})
	if errdefs.IsNotFound(err) {
		s.flat.drop(name)
		return
	}
	s.flat.requestEvict()
}

// checkNew fails with ErrAlreadyExists if key names a snapshot, before any
// staging work (a flatten may take seconds) is spent on it. The metadata
// transaction still decides a race between two creates of one key.
func (s *Snapshotter) checkNew(ctx context.Context, key string) error {
	return s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		_, _, _, err := storage.GetInfo(ctx, key)
		switch {
		case err == nil:
			return fmt.Errorf("create snapshot %s: %w", key, errdefs.ErrAlreadyExists)
		case errdefs.IsNotFound(err):
			return nil
		default:
			return fmt.Errorf("create snapshot %s: %w", key, err)
		}
	})
}

// isUnpack tells an unpack (the applier will write a layer into the dir)
// from a container snapshot (stage the parent chain).
func isUnpack(kind snapshots.Kind, key string, opts []snapshots.Opt) (bool, error) {
	info := snapshots.Info{Kind: kind, Name: key}
	for _, o := range opts {
		if err := o(&info); err != nil {
			return false, fmt.Errorf("apply snapshot option for %s: %w", key, err)
		}
	}
	return unpackInfo(info), nil
}

// unpackInfo tells whether the snapshot info describes an unpack.
func unpackInfo(info snapshots.Info) bool {
	if info.Kind != snapshots.KindActive {
		return false
	}
	if _, ok := info.Labels[snapshots.LabelSnapshotRef]; ok {
		return true
	}
	return strings.HasPrefix(info.Name, snapshots.UnpackKeyPrefix+"-")
}
