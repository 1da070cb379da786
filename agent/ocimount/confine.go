package ocimount

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	securejoin "github.com/cyphar/filepath-securejoin"
	"golang.org/x/sys/unix"
)

// Confine applies masked paths, read-only paths and, with readonlyRoot, a
// read-only root to the container's root at root, after its mounts, as
// runc does: a path the image lacks is skipped, and the mounts in the
// root keep their own flags.
func (s *Stack) Confine(root string, masked, readonly []string, readonlyRoot bool) error {
	for _, p := range masked {
		if err := s.mask(root, p); err != nil {
			return fmt.Errorf("mask %s: %w", p, err)
		}
	}
	for _, p := range readonly {
		if err := s.readonly(root, p); err != nil {
			return fmt.Errorf("make %s read-only: %w", p, err)
		}
	}
	if readonlyRoot {
		if err := s.Mount("", root, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
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
func (s *Stack) mask(root, p string) error {
	dst, fi, err := inRoot(root, p)
	if err != nil || fi == nil {
		return err
	}
	if fi.IsDir() {
		return s.Mount("tmpfs", dst, "tmpfs", unix.MS_RDONLY, "")
	}
	return s.Mount("/dev/null", dst, "", unix.MS_BIND, "")
}

// readonly makes p, and what is mounted under it, a read-only view.
func (s *Stack) readonly(root, p string) error {
	dst, fi, err := inRoot(root, p)
	if err != nil || fi == nil {
		return err
	}
	if err := s.Mount(dst, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	return s.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_REC, "")
}
