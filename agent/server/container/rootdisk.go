package container

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/errdefs"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// Roots mounts the root of a container joining the VM on a disk slot.
type Roots interface {
	// Mount finds r's disk (probing its slot again: the host may have
	// put another image behind it), laps api.PhaseDisk on clk, mounts it
	// read-only under an overlay whose writable upper is a tmpfs of its
	// own, all under dir, and returns the overlay's path. A failure leaves
	// nothing mounted.
	Mount(ctx context.Context, r *api.Rootfs, dir string, clk *api.Clock) (string, error)
	// Unmount undoes Mount of dir, so the host can detach the disk.
	Unmount(dir string) error
	// MountVolume finds v's disk, as Mount does, and mounts it read-only
	// at v's path; UnmountVolume undoes it.
	MountVolume(ctx context.Context, v *api.VolumeDisk) error
	UnmountVolume(v *api.VolumeDisk) error
}

// checkRoot wants the root as exactly one of a directory or a disk.
func checkRoot(o CreateOptions) error {
	switch {
	case o.Rootfs != "" && o.RootDisk != nil:
		return fmt.Errorf("root: rootfs %q and root disk %q, expected one of them: %w", o.Rootfs, o.RootDisk.Serial, errdefs.ErrInvalidArgument)
	case o.RootDisk != nil:
		if len(o.RootDisk.Mounts) > 0 {
			return fmt.Errorf("root disk %q: %d mounts, expected none (runc makes the spec's): %w", o.RootDisk.Serial, len(o.RootDisk.Mounts), errdefs.ErrInvalidArgument)
		}
		return nil
	case o.Rootfs == "":
		return fmt.Errorf("root: expected a rootfs directory or a root disk: %w", errdefs.ErrInvalidArgument)
	}
	return checkRootfs(o.Rootfs)
}

// claimDisk makes disk serial the root of container id alone: a second
// overlay on one disk would let two containers share it.
func (m *Manager) claimDisk(id, serial string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if other, ok := m.disks[serial]; ok {
		return fmt.Errorf("disk %q is the root of container %q already: %w", serial, other, errdefs.ErrFailedPrecondition)
	}
	m.disks[serial] = id
	return nil
}

func (m *Manager) releaseDisk(serial string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.disks, serial)
}

// mountRoot mounts o's root disk in bundle and returns the root, or
// returns o's directory.
func (m *Manager) mountRoot(ctx context.Context, id, bundle string, o CreateOptions, clk *api.Clock) (string, error) {
	if o.RootDisk == nil {
		return o.Rootfs, nil
	}
	if m.cfg.Roots == nil {
		return "", fmt.Errorf("root disk %q: this agent mounts no disks: %w", o.RootDisk.Serial, errdefs.ErrFailedPrecondition)
	}
	if err := m.claimDisk(id, o.RootDisk.Serial); err != nil {
		return "", err
	}
	root, err := m.cfg.Roots.Mount(ctx, o.RootDisk, bundle, clk)
	if err != nil {
		m.releaseDisk(o.RootDisk.Serial)
		return "", fmt.Errorf("root disk %q: %w", o.RootDisk.Serial, err)
	}
	return root, nil
}

// unmountRoot unmounts c's root disk, if it has one, and frees the disk.
// A disk that stays mounted stays claimed.
func (m *Manager) unmountRoot(c *Container) error {
	if c.disk == "" {
		return nil
	}
	if err := m.cfg.Roots.Unmount(c.bundle); err != nil {
		return fmt.Errorf("unmount the root of container %q from disk %q: %w", c.ID, c.disk, err)
	}
	m.releaseDisk(c.disk)
	return nil
}

// mountVolumes mounts o's volume disks for container c, each claimed as
// c's. A failure leaves none mounted.
func (m *Manager) mountVolumes(ctx context.Context, c *Container, o CreateOptions) error {
	if len(o.Volumes) == 0 {
		return nil
	}
	if m.cfg.Roots == nil {
		return fmt.Errorf("volume disk %q: this agent mounts no disks: %w", o.Volumes[0].Serial, errdefs.ErrFailedPrecondition)
	}
	for _, v := range o.Volumes {
		if err := m.claimDisk(c.ID, v.Serial); err != nil {
			return errors.Join(err, m.unmountVolumes(c))
		}
		if err := m.cfg.Roots.MountVolume(ctx, v); err != nil {
			m.releaseDisk(v.Serial)
			return errors.Join(fmt.Errorf("volume disk %q at %s: %w", v.Serial, v.Path, err), m.unmountVolumes(c))
		}
		c.volumes = append(c.volumes, v)
	}
	return nil
}

// unmountVolumes unmounts c's volume disks, last first, and frees them;
// one that stays mounted stays claimed, and c keeps it.
func (m *Manager) unmountVolumes(c *Container) error {
	for len(c.volumes) > 0 {
		v := c.volumes[len(c.volumes)-1]
		if err := m.cfg.Roots.UnmountVolume(v); err != nil {
			return fmt.Errorf("unmount volume disk %q of container %q: %w", v.Serial, c.ID, err)
		}
		m.releaseDisk(v.Serial)
		c.volumes = c.volumes[:len(c.volumes)-1]
	}
	return nil
}
