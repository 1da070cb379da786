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
	"github.com/containerd/containerd/v2/plugins/snapshots/overlay/overlayutils"
	"github.com/containerd/log"
)

// overlayOptions returns the options containerd's overlay snapshotter adds
// to every overlay mount on root: userxattr when the kernel needs it (in a
// user namespace), and index=off where the kernel has the option, so that
// layers stay usable as lower dirs of any number of mounts.
func overlayOptions(root string) []string {
	var opts []string
	userxattr, err := overlayutils.NeedsUserXAttr(root)
	if err != nil {
		log.L.WithError(err).Warnf("cannot detect whether overlay needs \"userxattr\", assuming %v", userxattr)
	}
	if userxattr {
		opts = append(opts, "userxattr")
	}
	if _, err := os.Stat("/sys/module/overlay/parameters/index"); err == nil {
		opts = append(opts, "index=off")
	}
	return opts
}

// snapState is an active or view snapshot with what its mounts depend on.
type snapState struct {
	snap storage.Snapshot
	// overlay: the parent is an ordinary layer, so the snapshot is an
	// overlay on the parent chain (unpack or container alike).
	overlay bool
}

// getState reads key's snapshot; ctx holds a metadata transaction.
func getState(ctx context.Context, key string) (snapState, error) {
	var (
		st  snapState
		err error
	)
	if st.snap, err = storage.GetSnapshot(ctx, key); err != nil {
		return st, err
	}
	_, info, _, err := storage.GetInfo(ctx, key)
	if err != nil {
		return st, err
	}
	if info.Parent != "" {
		_, pinfo, _, err := storage.GetInfo(ctx, info.Parent)
		if err != nil {
			return st, fmt.Errorf("parent of %s: %w", key, err)
		}
		st.overlay = isOrdinary(pinfo)
	}
	return st, nil
}

// mounts returns the mounts of an active or view snapshot. A snapshot
// without a parent or on a link is a bind mount of its dir (an unpack or a
// staged chain); one on an ordinary layer gets the mounts containerd's
// overlay snapshotter would give it.
func (s *Snapshotter) mounts(st snapState) []mount.Mount {
	snap := st.snap
	if !st.overlay {
		mode := "rw"
		if snap.Kind == snapshots.KindView {
			mode = "ro"
		}
		return []mount.Mount{{Type: "bind", Source: s.dir(snap.ID), Options: []string{"rbind", mode}}}
	}
	lowers := s.layerDirs(snap.ParentIDs)
	if snap.Kind == snapshots.KindView && len(lowers) == 1 {
		return []mount.Mount{{Type: "bind", Source: lowers[0], Options: []string{"ro", "rbind"}}}
	}
	var opts []string
	if snap.Kind == snapshots.KindActive {
		opts = append(opts,
			"workdir="+filepath.Join(s.dir(snap.ID), workDirName),
			"upperdir="+filepath.Join(s.dir(snap.ID), upperDirName))
	}
	opts = append(opts, "lowerdir="+strings.Join(lowers, ":"))
	opts = append(opts, s.overlayOpts...)
	return []mount.Mount{{Type: "overlay", Source: "overlay", Options: opts}}
}
