package testimage

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
)

// Bake is a snapshot image baked by cocoonctl: the guest in guestDir booted
// on QEMU with memory bytes of RAM, snapshotted into dir/link and packed as
// ref into the OCI archive dir/image.tar, whose path it returns. The bake
// reads no config (the defaults) and gives up after four minutes.
func Bake(cocoonctl, guestDir, ref string, memory int64, dir string) (string, error) {
	archive := filepath.Join(dir, "image.tar")
	cmd := exec.Command(cocoonctl, "bake", "--guest", guestDir, "--memory", strconv.FormatInt(memory>>20, 10)+"M",
		"--out", filepath.Join(dir, "link"), "--image", ref, "--archive", archive,
		"--config", "/dev/null", "--timeout", "4m")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("bake %s: %w\n%s", ref, err, out)
	}
	return archive, nil
}
