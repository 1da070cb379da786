package snapshotter

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"github.com/containerd/continuity/fs"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// Commit publishes the layer unpacked into the active snapshot key as name.
// Its kind is decided here, from what the applier wrote: a layer on a link
// must be a link; a layer with no parent is a link if its root holds
// link.json and memory.extents; anything else is an ordinary layer, kept
// as containerd's overlay snapshotter keeps it. A link is validated against
// its parent, its memory data digest verified, and it is made read-only.
// An invalid link fails with ErrInvalidArgument and changes nothing: key
// stays active and removable.
func (s *Snapshotter) Commit(ctx context.Context, name, key string, opts ...snapshots.Opt) error {
	a, err := s.activeSnapshot(ctx, key)
	if err != nil {
		return err
	}
	kind, err := s.layerKind(a)
	if err != nil {
		return fmt.Errorf("commit %s: %w", key, err)
	}
	if kind == kindLink {
		return s.commitLink(ctx, name, key, a, opts)
	}
	return s.commitOrdinary(ctx, name, key, a, opts)
}

// layerKind decides what the layer in the active snapshot a is.
func (s *Snapshotter) layerKind(a activeSnap) (string, error) {
	switch {
	case a.parentOrdinary:
		return kindOrdinary, nil
	case a.parentID != "":
		return kindLink, nil
	}
	link, err := holdsLink(s.dir(a.id))
	if err != nil || !link {
		return kindOrdinary, err
	}
	return kindLink, nil
}

// commitLink validates and publishes a link.
func (s *Snapshotter) commitLink(ctx context.Context, name, key string, a activeSnap, opts []snapshots.Opt) error {
	dir := s.dir(a.id)
	var (
		parent *chain.Link
		err    error
	)
	if a.parentID != "" {
		if parent, err = chain.ReadLink(s.dir(a.parentID)); err != nil {
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
		why := "not a valid snapshot link"
		if held, _ := holdsLink(dir); parent != nil && !held {
			why += " (every layer on a link must be one)"
		}
		return fmt.Errorf("commit %s as %s: %s: %w: %w", key, name, why, err, errdefs.ErrInvalidArgument)
	}
	usage, err := fs.DiskUsage(ctx, dir)
	if err != nil {
		return fmt.Errorf("commit %s: measure: %w", key, err)
	}
	if err := setWritable(dir, false); err != nil {
		return fmt.Errorf("commit %s: make read-only: %w", key, err)
	}
	if err := s.commitActive(ctx, name, key, kindLink, snapshots.Usage(usage), opts); err != nil {
		if werr := setWritable(dir, true); werr != nil {
			log.G(ctx).WithError(werr).WithField("path", dir).Warn("restoring write access after a failed commit")
		}
		return err
	}
	log.G(ctx).WithFields(log.Fields{"name": name, "link": link.ID(), "kind": link.Kind}).Debug("committed link")
	return nil
}

// commitOrdinary publishes an ordinary layer. Its files keep their modes:
// overlay never writes a lower dir. A container snapshot committed as a
// layer drops its staged image, which would otherwise stay pinned.
func (s *Snapshotter) commitOrdinary(ctx context.Context, name, key string, a activeSnap, opts []snapshots.Opt) error {
	files := s.filesDir(a.id, a.parentID != "")
	usage, err := fs.DiskUsage(ctx, files)
	if err != nil {
		return fmt.Errorf("commit %s: measure: %w", key, err)
	}
	if err := s.commitActive(ctx, name, key, kindOrdinary, snapshots.Usage(usage), opts); err != nil {
		return err
	}
	if a.parentID != "" {
		if err := unstageRootfs(s.dir(a.id)); err != nil {
			log.G(ctx).WithError(err).WithField("name", name).Warn("dropping the staged image of a committed snapshot")
		}
		s.flat.requestEvict()
	}
	log.G(ctx).WithFields(log.Fields{"name": name, "bytes": usage.Size}).Debug("committed ordinary layer")
	return nil
}

// commitActive commits key as name in the metadata, labelled with its kind.
func (s *Snapshotter) commitActive(ctx context.Context, name, key, kind string, usage snapshots.Usage, opts []snapshots.Opt) error {
	opts = append(opts[:len(opts):len(opts)], snapshots.WithLabels(map[string]string{labelKind: kind}))
	err := s.ms.WithTransaction(ctx, true, func(ctx context.Context) error {
		_, err := storage.CommitActive(ctx, key, name, usage, opts...)
		return err
	})
	if err != nil {
		return fmt.Errorf("commit %s as %s: %w", key, name, err)
	}
	return nil
}

// activeSnap is an active snapshot about to be committed.
type activeSnap struct {
	id, parentID   string
	parentOrdinary bool
}

// activeSnapshot returns the active snapshot key and what its parent is.
func (s *Snapshotter) activeSnapshot(ctx context.Context, key string) (activeSnap, error) {
	var a activeSnap
	err := s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		st, err := getState(ctx, key)
		if err != nil {
			return fmt.Errorf("commit %s: %w", key, err)
		}
		if st.snap.Kind != snapshots.KindActive {
			return fmt.Errorf("commit %s: a %s snapshot cannot be committed: %w", key, st.snap.Kind, errdefs.ErrFailedPrecondition)
		}
		a.id, a.parentOrdinary = st.snap.ID, st.overlay
		if len(st.snap.ParentIDs) > 0 {
			a.parentID = st.snap.ParentIDs[0]
		}
		return nil
	})
	return a, err
}

// Remove deletes a snapshot and its dir. Removing a staged snapshot drops
// its hard link of the flat file; removing a committed snapshot also drops
// the flat file of the chain it tops (a link's flattened memory, an ordinary
// layer's rootfs image), in the background once nothing pins it.
func (s *Snapshotter) Remove(ctx context.Context, key string) error {
	s.dirs.RLock()
	defer s.dirs.RUnlock()
	var (
		kind              snapshots.Kind
		id, path, renamed string
		ordinary          bool
		created           time.Time
	)
	err := s.ms.WithTransaction(ctx, true, func(ctx context.Context) error {
		_, info, _, err := storage.GetInfo(ctx, key)
		if err != nil {
			return fmt.Errorf("remove %s: %w", key, err)
		}
		ordinary, created = isOrdinary(info), info.Created
		if id, kind, err = storage.Remove(ctx, key); err != nil {
			return fmt.Errorf("remove %s: %w", key, err)
		}
		path = s.dir(id)
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
	switch {
	case kind != snapshots.KindCommitted:
	case ordinary:
		s.flat.drop(rootfsCacheName(id, created))
	default:
		if link, err := chain.ReadLink(renamed); err == nil {
			s.flat.drop(link.ID().Encoded())
		}
	}
	removeDir(ctx, renamed)
	// Dropping a staged link may unpin an orphan or a file over budget.
	s.flat.requestEvict()
	return nil
}
