package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"github.com/containerd/errdefs"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// labelKind records on a committed snapshot what its layer is, decided once
// by Commit from the layer's content: a snapshot-chain link or an ordinary
// OCI layer. The snapshotter owns it: Update keeps it whatever a client
// sends. A committed snapshot without it is a link (every snapshot
// committed before ordinary layers were served was one).
const (
	labelKind    = "io.cocoon.snapshot.kind"
	kindLink     = "link"
	kindOrdinary = "ordinary"
)

// Ordinary layers are stored as containerd's overlay snapshotter stores
// them, with one difference: a layer without a parent is unpacked before
// its kind is known, into the snapshot dir itself (as a link is), so its
// files are the dir. Every other ordinary snapshot's files are its upper
// dir, next to the overlay work dir.
const (
	upperDirName = "fs"
	workDirName  = "work"
)

// rootfsCacheName names, in the flat cache, the filesystem image of the
// ordinary layer chain whose top is the snapshot id, committed at time
// committed. A metadata store never reuses an ID; the time keeps the name
// from meaning another chain even if the store is deleted and made anew.
func rootfsCacheName(id string, committed time.Time) string {
	return fmt.Sprintf("erofs-%s-%d", id, committed.UnixNano())
}

// layerChain is a committed snapshot and its ancestors.
type layerChain struct {
	ordinary bool
	ids      []string  // snapshot IDs, newest first (as storage.Snapshot.ParentIDs)
	created  time.Time // when the top was committed
}

// rootfsName is the flat cache name of the chain's rootfs image.
func (lc layerChain) rootfsName() string { return rootfsCacheName(lc.ids[0], lc.created) }

// isOrdinary tells an ordinary layer from a link by its committed info.
func isOrdinary(info snapshots.Info) bool {
	return info.Labels[labelKind] == kindOrdinary
}

// resolveChain returns the chain ending at the committed snapshot name. A
// chain is links only or ordinary layers only: Commit never puts one kind
// on the other.
func (s *Snapshotter) resolveChain(ctx context.Context, name string) (layerChain, error) {
	var lc layerChain
	err := s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		for n := name; n != ""; {
			id, info, _, err := storage.GetInfo(ctx, n)
			if err != nil {
				return fmt.Errorf("resolve parent chain: %w", err)
			}
			if info.Kind != snapshots.KindCommitted {
				return fmt.Errorf("parent %s is %s, want a committed snapshot: %w", n, info.Kind, errdefs.ErrFailedPrecondition)
			}
			if len(lc.ids) == 0 {
				lc.ordinary, lc.created = isOrdinary(info), info.Created
			} else if isOrdinary(info) != lc.ordinary {
				return fmt.Errorf("parent chain of %s mixes links and ordinary layers at %s: %w", name, n, errdefs.ErrFailedPrecondition)
			}
			lc.ids = append(lc.ids, id)
			n = info.Parent
		}
		return nil
	})
	return lc, err
}

// linkDirs returns the link dirs of a chain of links, oldest first.
func (s *Snapshotter) linkDirs(lc layerChain) []string {
	dirs := make([]string, len(lc.ids))
	for i, id := range lc.ids {
		dirs[len(dirs)-1-i] = s.dir(id)
	}
	return dirs
}

// layerDirs returns the files dirs of ordinary layers ids, newest first
// (the order of overlay's lowerdir): the oldest has no parent.
func (s *Snapshotter) layerDirs(ids []string) []string {
	dirs := make([]string, len(ids))
	for i, id := range ids {
		dirs[i] = s.filesDir(id, i < len(ids)-1)
	}
	return dirs
}

// filesDir is where the files of ordinary snapshot id are.
func (s *Snapshotter) filesDir(id string, hasParent bool) string {
	if hasParent {
		return filepath.Join(s.dir(id), upperDirName)
	}
	return s.dir(id)
}

// holdsLink tells whether a layer unpacked with no parent is a link: its
// root holds link.json and memory.extents. Commit then validates it.
func holdsLink(dir string) (bool, error) {
	for _, name := range []string{chain.LinkFile, chain.ExtentsFile} {
		_, err := os.Lstat(filepath.Join(dir, name))
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
	}
	return true, nil
}

// makeOverlayDirs creates the upper and (for an active snapshot) work dirs
// in dir, the upper owned as the parent layer's files dir is, as
// containerd's overlay snapshotter does.
func makeOverlayDirs(dir string, kind snapshots.Kind, parentFiles string) error {
	upper := filepath.Join(dir, upperDirName)
	if err := os.Mkdir(upper, 0o755); err != nil {
		return fmt.Errorf("create upper dir: %w", err)
	}
	if kind == snapshots.KindActive {
		if err := os.Mkdir(filepath.Join(dir, workDirName), 0o711); err != nil {
			return fmt.Errorf("create work dir: %w", err)
		}
	}
	fi, err := os.Stat(parentFiles)
	if err != nil {
		return fmt.Errorf("stat parent layer: %w", err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if err := os.Lchown(upper, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("chown upper dir: %w", err)
	}
	return nil
}
