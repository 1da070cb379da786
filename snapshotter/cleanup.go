package snapshotter

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

const (
	tempDirPrefix    = "new-" // a snapshot dir being filled, not yet in the metadata
	removedDirPrefix = "rm-"  // a snapshot dir already gone from the metadata
)

// Cleanup removes snapshot dirs the metadata does not know: leftovers of
// a crash or of a failed remove. Dirs still being filled are kept.
func (s *Snapshotter) Cleanup(ctx context.Context) error {
	return s.reconcile(ctx, false)
}

// reconcile removes every dir under snapshots/ without a snapshot in the
// metadata. At startup nothing is in flight, so temp dirs go too.
func (s *Snapshotter) reconcile(ctx context.Context, startup bool) error {
	s.dirs.Lock()
	defer s.dirs.Unlock()
	var ids map[string]string
	err := s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		var err error
		ids, err = storage.IDMap(ctx)
		if errdefs.IsNotFound(err) {
			return nil // a fresh store has no snapshot bucket yet
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("reconcile snapshot dirs: %w", err)
	}
	top := filepath.Join(s.root, "snapshots")
	des, err := os.ReadDir(top)
	if err != nil {
		return fmt.Errorf("reconcile snapshot dirs: %w", err)
	}
	for _, de := range des {
		name := de.Name()
		if _, ok := ids[name]; ok || (!startup && strings.HasPrefix(name, tempDirPrefix)) {
			continue
		}
		log.G(ctx).WithField("path", filepath.Join(top, name)).Info("removing snapshot dir without metadata")
		removeDir(ctx, filepath.Join(top, name))
	}
	return nil
}

// snapRecord is a snapshot in the metadata and its dir's ID.
type snapRecord struct {
	id   string
	info snapshots.Info
}

// snapshots lists every snapshot in the metadata.
func (s *Snapshotter) snapshots(ctx context.Context) ([]snapRecord, error) {
	var recs []snapRecord
	err := s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		ids, err := storage.IDMap(ctx)
		if errdefs.IsNotFound(err) {
			return nil // a fresh store has no snapshot bucket yet
		} else if err != nil {
			return err
		}
		for _, key := range ids {
			id, info, _, err := storage.GetInfo(ctx, key)
			if err != nil {
				return err
			}
			recs = append(recs, snapRecord{id: id, info: info})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	return recs, nil
}

// dropOrphans drops the flat files whose top snapshot is no longer
// committed, which a restart between its Remove and the eviction pass leaves.
func (s *Snapshotter) dropOrphans(ctx context.Context) error {
	recs, err := s.snapshots(ctx)
	if err != nil {
		return err
	}
	live := map[string]bool{}
	for _, r := range recs {
		if r.info.Kind != snapshots.KindCommitted {
			continue
		}
		if isOrdinary(r.info) {
			live[rootfsCacheName(r.id, r.info.Created)] = true
		} else if l, err := chain.ReadLink(s.dir(r.id)); err == nil {
			live[l.ID().Encoded()] = true
		}
	}
	var orphans []string
	for _, name := range s.flat.names() {
		if !live[name] {
			orphans = append(orphans, name)
		}
	}
	s.flat.drop(orphans...)
	return nil
}

// removeDir removes a snapshot dir, first making a committed (read-only)
// link writable so that it also works without CAP_DAC_OVERRIDE.
func removeDir(ctx context.Context, dir string) {
	if _, err := os.Lstat(dir); err != nil {
		return
	}
	if err := setWritable(dir, true); err != nil {
		log.G(ctx).WithError(err).WithField("path", dir).Warn("making snapshot dir writable for removal")
	}
	if err := os.RemoveAll(dir); err != nil {
		log.G(ctx).WithError(err).WithField("path", dir).Warn("removing snapshot dir")
	}
}

// setWritable adds or drops the owner's write permission on dir and
// everything in it. Staged memory files (0444 hard links of shared flat
// files) are never made writable: dropping write on a dir is enough to
// remove them.
func setWritable(dir string, writable bool) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 || (!d.IsDir() && writable) {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		mode := fi.Mode().Perm() &^ 0o222
		if writable {
			mode |= 0o200
		}
		return os.Chmod(p, mode)
	})
}
