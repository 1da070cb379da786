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
// unpack key) or no parent it is an empty dir for containerd's applier to
// unpack a link into; on a committed parent it is a staged chain for a
// container.
func (s *Snapshotter) Prepare(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	return s.create(ctx, snapshots.KindActive, key, parent, opts)
}

// View creates a read-only staged chain of parent (an empty dir when parent
// is empty).
func (s *Snapshotter) View(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	return s.create(ctx, snapshots.KindView, key, parent, opts)
}

// create fills a temp dir first and renames it into place inside the
// metadata transaction, so a crash leaves either nothing or a temp dir that
// the next start removes.
func (s *Snapshotter) create(ctx context.Context, kind snapshots.Kind, key, parent string, opts []snapshots.Opt) ([]mount.Mount, error) {
	unpack, err := isUnpack(kind, key, opts)
	if err != nil {
		return nil, err
	}
	if err := s.checkNew(ctx, key); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(filepath.Join(s.root, "snapshots"), tempDirPrefix)
	if err != nil {
		return nil, fmt.Errorf("create snapshot dir: %w", err)
	}
	defer removeDir(ctx, tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, fmt.Errorf("chmod snapshot dir: %w", err)
	}
	if parent != "" && !unpack {
		if err := s.stage(ctx, parent, tmp); err != nil {
			return nil, fmt.Errorf("stage %s on %s: %w", key, parent, err)
		}
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
	return s.mounts(snap), nil
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

// chainDirs returns the link dirs of the committed snapshot name and its
// ancestors, oldest first.
func (s *Snapshotter) chainDirs(ctx context.Context, name string) ([]string, error) {
	var dirs []string
	err := s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		for name != "" {
			id, info, _, err := storage.GetInfo(ctx, name)
			if err != nil {
				return fmt.Errorf("resolve chain: %w", err)
			}
			if info.Kind != snapshots.KindCommitted {
				return fmt.Errorf("parent %s is %s, want a committed link: %w", name, info.Kind, errdefs.ErrFailedPrecondition)
			}
			dirs = append(dirs, s.dir(id))
			name = info.Parent
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for i, j := 0, len(dirs)-1; i < j; i, j = i+1, j-1 {
		dirs[i], dirs[j] = dirs[j], dirs[i]
	}
	return dirs, nil
}
