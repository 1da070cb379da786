package snapshotter

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"github.com/containerd/continuity/fs"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// Commit validates the link unpacked into the active snapshot key against
// its parent link, verifies its memory data digest, and publishes it
// read-only as name. An invalid link fails with ErrInvalidArgument and
// changes nothing: key stays active and removable.
func (s *Snapshotter) Commit(ctx context.Context, name, key string, opts ...snapshots.Opt) error {
	id, parentID, err := s.activeIDs(ctx, key)
	if err != nil {
		return err
	}
	dir := s.dir(id)
	var parent *chain.Link
	if parentID != "" {
		if parent, err = chain.ReadLink(s.dir(parentID)); err != nil {
			return fmt.Errorf("commit %s: read parent link: %w", key, err)
		}
	}
	link, err := chain.Validate(dir, parent)
	if err == nil {
		// Hashing now, while the unpack's bytes are in the page cache,
		// fails a corrupt layer at import instead of at a container's
		// first Prepare.
		err = chain.VerifyData(ctx, dir, link)
	}
	if err != nil {
		// The cause goes in the message only: a second %w would reach gRPC
		// clients as an extra error detail and print "invalid argument" twice.
		return fmt.Errorf("commit %s as %s: not a valid snapshot link: %v: %w", key, name, err, errdefs.ErrInvalidArgument)
	}
	usage, err := fs.DiskUsage(ctx, dir)
	if err != nil {
		return fmt.Errorf("commit %s: measure: %w", key, err)
	}
	if err := setWritable(dir, false); err != nil {
		return fmt.Errorf("commit %s: make read-only: %w", key, err)
	}
	err = s.ms.WithTransaction(ctx, true, func(ctx context.Context) error {
		_, err := storage.CommitActive(ctx, key, name, snapshots.Usage(usage), opts...)
		return err
	})
	if err != nil {
		if werr := setWritable(dir, true); werr != nil {
			log.G(ctx).WithError(werr).WithField("path", dir).Warn("restoring write access after a failed commit")
		}
		return fmt.Errorf("commit %s as %s: %w", key, name, err)
	}
	log.G(ctx).WithFields(log.Fields{"name": name, "link": link.ID(), "kind": link.Kind}).Debug("committed link")
	return nil
}

// activeIDs returns the IDs of the active snapshot key and of its parent
// (empty without one).
func (s *Snapshotter) activeIDs(ctx context.Context, key string) (id, parentID string, err error) {
	err = s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		snap, err := storage.GetSnapshot(ctx, key)
		if err != nil {
			return fmt.Errorf("commit %s: %w", key, err)
		}
		if snap.Kind != snapshots.KindActive {
			return fmt.Errorf("commit %s: a %s snapshot cannot be committed: %w", key, snap.Kind, errdefs.ErrFailedPrecondition)
		}
		id = snap.ID
		if len(snap.ParentIDs) > 0 {
			parentID = snap.ParentIDs[0]
		}
		return nil
	})
	return id, parentID, err
}

// Remove deletes a snapshot and its dir. Removing a staged snapshot drops
// its hard link of the flat file; removing a committed link also drops the
// chain's flat file, in the background once nothing pins it.
func (s *Snapshotter) Remove(ctx context.Context, key string) error {
	s.dirs.RLock()
	defer s.dirs.RUnlock()
	var (
		kind          snapshots.Kind
		path, renamed string
	)
	err := s.ms.WithTransaction(ctx, true, func(ctx context.Context) error {
		id, k, err := storage.Remove(ctx, key)
		if err != nil {
			return fmt.Errorf("remove %s: %w", key, err)
		}
		kind, path = k, s.dir(id)
		renamed = filepath.Join(s.root, "snapshots", removedDirPrefix+id)
		if err := os.Rename(path, renamed); err != nil {
			if !os.IsNotExist(err) {
				return fmt.Errorf("remove %s: %w", key, err)
			}
			renamed = ""
		}
		return nil
	})
	if err != nil {
		if renamed != "" {
			if rerr := os.Rename(renamed, path); rerr != nil {
				log.G(ctx).WithError(rerr).WithField("path", renamed).Error("restoring dir after a failed remove")
			}
		}
		return err
	}
	if renamed == "" {
		return nil
	}
	if kind == snapshots.KindCommitted {
		if link, err := chain.ReadLink(renamed); err == nil {
			s.flat.drop(link.ID().Encoded())
		}
	}
	removeDir(ctx, renamed)
	// Dropping a staged link may unpin an orphan or a file over budget.
	s.flat.requestEvict()
	return nil
}
