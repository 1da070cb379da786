package firecracker

import (
	"fmt"
	"os"
	"path/filepath"
)

// rootfsPath is the path a cocoon Firecracker snapshot records for its
// rootfs slot's image (the drive's path_on_host). It is relative, so
// Firecracker, which runs in the VM's run directory, opens it there during
// the load, where placeRootfs has put this restore's image: a snapshot
// cannot name that image (Firecracker cannot override a drive's host end
// on load, see restored.go), so it names a place only the driver fills.
const rootfsPath = "cocoon-rootfs"

// placeRootfs puts the rootfs slot's image at rootfsPath in runDir: a
// symbolic link to disk (an absolute path; the run directory and the
// staged image are on different filesystems as a rule, so a hard link
// would not do), or, when the restore gives none, an empty file, which
// the guest leaves unbound. Firecracker computes the slot's capacity from
// the image it opens, so the guest sees the image's own size.
func placeRootfs(runDir, disk string) error {
	path := filepath.Join(runDir, rootfsPath)
	if disk != "" {
		if err := os.Symlink(disk, path); err != nil {
			return fmt.Errorf("place rootfs image: %w", err)
		}
		return nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o444)
	if err != nil {
		return fmt.Errorf("place empty rootfs image: %w", err)
	}
	return f.Close()
}
