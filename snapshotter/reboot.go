package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/continuity"
	"github.com/containerd/log"
)

// bootIDFile records the boot the snapshotter last started in.
const bootIDFile = "boot_id"

// readBootID returns the kernel's ID of the current boot.
func readBootID() (string, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("read boot id: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// restageAfterReboot re-stages every staged snapshot if the host has booted
// since the last start. Staging never fsyncs, nor does the flat cache it
// links from (both sit on a container's first start): their files can be
// lost only in a host crash, which also ends every VM that used them, so a
// new boot is exactly when they need rebuilding; the flat cache goes first.
// A restart within one boot keeps them: running VMs use them. Without a
// record (a new root) it only records the boot.
func (s *Snapshotter) restageAfterReboot(ctx context.Context, bootID func() (string, error)) error {
	cur, err := bootID()
	if err != nil {
		return err
	}
	path := filepath.Join(s.root, bootIDFile)
	prev, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("read last boot id: %w", err)
	case strings.TrimSpace(string(prev)) != cur:
		if err := s.flat.dropAll(); err != nil {
			return err
		}
		s.restageAll(ctx)
	default:
		return nil
	}
	// Lost in a crash, the record only makes the next start re-stage again.
	if err := continuity.AtomicWriteFile(path, []byte(cur+"\n"), 0o600); err != nil {
		return fmt.Errorf("record boot id: %w", err)
	}
	return nil
}

// stagedSnap is a container snapshot: a staged chain on parent.
type stagedSnap struct {
	id, key, parent string
	kind            snapshots.Kind
}

// restageAll rebuilds every staged dir from its parent chain. A snapshot
// that cannot be re-staged is logged and left empty, so that its user
// fails on it clearly instead of the whole snapshotter failing to start.
func (s *Snapshotter) restageAll(ctx context.Context) {
	snaps, err := s.stagedSnapshots(ctx)
	if err != nil {
		log.G(ctx).WithError(err).Error("listing staged snapshots to re-stage after a reboot")
		return
	}
	for _, sn := range snaps {
		if err := s.restage(ctx, sn); err != nil {
			log.G(ctx).WithError(err).WithField("key", sn.key).Error("re-staging a snapshot after a reboot")
			continue
		}
		log.G(ctx).WithField("key", sn.key).Info("re-staged snapshot after a reboot")
	}
}

// restage rebuilds what sn's dir staged. A container on ordinary layers
// keeps its upper and work dirs, which hold the container's writes.
func (s *Snapshotter) restage(ctx context.Context, sn stagedSnap) error {
	lc, err := s.resolveChain(ctx, sn.parent)
	if err != nil {
		return err
	}
	dir := s.dir(sn.id)
	if lc.ordinary {
		if sn.kind != snapshots.KindActive {
			return nil
		}
		if err := unstageRootfs(dir); err != nil {
			return err
		}
		_, err := s.stageRootfs(ctx, lc, dir)
		return err
	}
	removeDir(ctx, dir)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("create snapshot dir: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return fmt.Errorf("chmod snapshot dir: %w", err)
	}
	_, err = s.stageLinks(ctx, lc, dir)
	return err
}

// stagedSnapshots lists the active and view snapshots that are staged
// chains (not unpacks, not empty).
func (s *Snapshotter) stagedSnapshots(ctx context.Context) ([]stagedSnap, error) {
	all, err := s.snapshots(ctx)
	if err != nil {
		return nil, err
	}
	var snaps []stagedSnap
	for _, r := range all {
		if r.info.Kind != snapshots.KindCommitted && r.info.Parent != "" && !unpackInfo(r.info) {
			snaps = append(snaps, stagedSnap{id: r.id, key: r.info.Name, parent: r.info.Parent, kind: r.info.Kind})
		}
	}
	return snaps, nil
}
