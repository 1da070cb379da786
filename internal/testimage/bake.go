package testimage

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
)

// BakeOptions shape Bake's snapshot beyond its guest and memory.
type BakeOptions struct {
	// DiskSlots is how many spare, empty disk slots the snapshot's VM
	// has, for the containers of a pod that join it (shim.pod_vm =
	// "pod"); cocoonctl bake --disk-slots, 0 to 16.
	DiskSlots int
}

// Bake is a snapshot image baked by cocoonctl: the guest in guestDir booted
// on QEMU with memory bytes of RAM, snapshotted into dir/link and packed as
// ref into the OCI archive dir/image.tar, whose path it returns. The bake
// reads no config (the defaults) and gives up after four minutes.
func Bake(cocoonctl, guestDir, ref string, memory int64, dir string, opts BakeOptions) (string, error) {
	archive := filepath.Join(dir, "image.tar")
	cmd := exec.Command(cocoonctl, "bake", "--guest", guestDir, "--memory", strconv.FormatInt(memory>>20, 10)+"M",
		"--disk-slots", strconv.Itoa(opts.DiskSlots),
		"--out", filepath.Join(dir, "link"), "--image", ref, "--archive", archive,
		"--config", "/dev/null", "--timeout", "4m")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("bake %s: %w\n%s", ref, err, out)
	}
	return archive, nil
}
