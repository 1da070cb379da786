package server

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	securejoin "github.com/cyphar/filepath-securejoin"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// confine applies r's masked paths, read-only paths and read-only root to
// the container's root at root, after its mounts, as runc does: a path
// the image lacks is skipped, and the mounts in the root keep their own
// flags.
func (s *mountStack) confine(root string, r *api.Rootfs) error {
	for _, p := range r.MaskedPaths {
		if err := s.mask(root, p); err != nil {
			return fmt.Errorf("mask %s: %w", p, err)
		}
	}
	for _, p := range r.ReadonlyPaths {
		if err := s.readonly(root, p); err != nil {
			return fmt.Errorf("make %s read-only: %w", p, err)
		}
	}
	if r.Readonly {
		if err := s.mount("", root, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("make the root read-only: %w", err)
		}
	}
	return nil
}

// inRoot is p inside root, and whether something is there.
func inRoot(root, p string) (string, fs.FileInfo, error) {
	dst, err := securejoin.SecureJoin(root, p)
	if err != nil {
		return "", nil, err
	}
	fi, err := os.Lstat(dst)
	if errors.Is(err, fs.ErrNotExist) {
		return dst, nil, nil
	}
	return dst, fi, err
}

// mask hides p: a directory under an empty read-only tmpfs, anything else
// under /dev/null.
func (s *mountStack) mask(root, p string) error {
	dst, fi, err := inRoot(root, p)
	if err != nil || fi == nil {
		return err
	}
	if fi.IsDir() {
		return s.mount("tmpfs", dst, "tmpfs", unix.MS_RDONLY, "")
	}
	return s.mount("/dev/null", dst, "", unix.MS_BIND, "")
}

// readonly makes p, and what is mounted under it, a read-only view.
func (s *mountStack) readonly(root, p string) error {
	dst, fi, err := inRoot(root, p)
	if err != nil || fi == nil {
		return err
	}
	if err := s.mount(dst, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	return s.mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_REC, "")
}
