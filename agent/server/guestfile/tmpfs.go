package guestfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// mountTmpfs mounts a tmpfs of size bytes, mode perm, at the directory
// dir, unless one is mounted there already (a pod's shared copy that a
// second container binds).
func mountTmpfs(dir string, size uint64, perm fs.FileMode) error {
	mounted, err := tmpfsMountPoint(dir)
	if err != nil || mounted {
		return err
	}
	if perm == 0 {
		perm = 0o755
	}
	data := fmt.Sprintf("size=%d,mode=%#o", size, perm)
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		return fmt.Errorf("mount a tmpfs of %d bytes: %w", size, err)
	}
	return nil
}

// tmpfsMountPoint says whether dir is the root of a tmpfs mount: a tmpfs
// on another device than its parent's.
func tmpfsMountPoint(dir string) (bool, error) {
	var fsStat unix.Statfs_t
	if err := unix.Statfs(dir, &fsStat); err != nil {
		return false, err
	}
	if fsStat.Type != unix.TMPFS_MAGIC {
		return false, nil
	}
	var st, parent unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return false, err
	}
	if err := unix.Lstat(filepath.Dir(dir), &parent); err != nil {
		return false, err
	}
	return st.Dev != parent.Dev, nil
}

// Remove removes path and what is under it; a tmpfs mounted at path
// (File.tmpfs_size) is unmounted first.
func Remove(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	return os.RemoveAll(path)
}
