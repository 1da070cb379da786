// Package stackrun runs cocoon containers in a private containerd
// (internal/devstack) for the demo and the benchmark: the project guest's
// snapshot image, baked once by `cocoonctl bake` and cached, imported into
// the stack, and containers created and started through the Go client.
package stackrun

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/qemu"
)

// Cmdline is the guest kernel command line the image is baked with (the
// QEMU driver adds the TSC hint a TCG guest needs); a cold boot of the
// same guest uses it too.
const Cmdline = "console=ttyS0 panic=-1 quiet"

// bakeTimeout bounds baking the snapshot image.
const bakeTimeout = 5 * time.Minute

// SnapshotImage is a baked guest snapshot, cached between runs: its chain
// link directory and an OCI image archive of it for `ctr images import`.
type SnapshotImage struct {
	Ref     string
	LinkDir string
	Archive string
	Cached  bool
}

// ImageSpec says which snapshot to bake, where to cache it and where
// cocoonctl, which bakes it, is.
type ImageSpec struct {
	Guest  string // guest build dir (vmlinuz, initramfs.cpio.gz, BUILDINFO)
	Cache  string // parent dir of the cached images
	Memory string // guest memory, e.g. 512M
	BinDir string // holds cocoonctl
	// DiskSlots are spare disk slots for the containers of a pod's VM
	// (cocoonctl bake --disk-slots); 0 bakes none.
	DiskSlots int
}

// EnsureImage returns the cached snapshot image for spec, baking and
// packing it first if the guest build, memory size, kernel command line or
// QEMU build changed. The key covers the guest's BUILDINFO, which records
// the kernel, busybox and agent hashes.
func EnsureImage(ctx context.Context, out io.Writer, spec ImageSpec) (SnapshotImage, error) {
	guest, err := filepath.Abs(spec.Guest)
	if err != nil {
		return SnapshotImage{}, fmt.Errorf("guest dir: %w", err)
	}
	key, err := imageKey(ctx, guest, spec.Memory, spec.DiskSlots)
	if err != nil {
		return SnapshotImage{}, err
	}
	unlock, err := lockCache(spec.Cache)
	if err != nil {
		return SnapshotImage{}, err
	}
	defer unlock()
	dir := filepath.Join(spec.Cache, key)
	img := SnapshotImage{
		Ref:     "docker.io/cocoon/guest:" + key,
		LinkDir: filepath.Join(dir, "link"),
		Archive: filepath.Join(dir, "image.tar"),
	}
	if _, err := chain.ReadLink(img.LinkDir); err == nil {
		if _, err := os.Stat(img.Archive); err == nil {
			img.Cached = true
			return img, nil
		}
	}
	spec.Guest = guest
	if err := bakeInto(ctx, out, spec, img, dir); err != nil {
		return SnapshotImage{}, err
	}
	return img, nil
}

// lockCache takes the cache's lock, so runs that start together (the demo's
// and the benchmark's tests) bake an image once: the others wait and find
// it cached. The returned func unlocks.
func lockCache(cache string) (func(), error) {
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return nil, fmt.Errorf("create image cache: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(cache, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock image cache: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock image cache: %w", err)
	}
	return func() { f.Close() }, nil
}

// bakeInto bakes img with `cocoonctl bake` into a temp dir next to dir and
// renames it into place, so an interrupted bake never leaves a
// half-written cache entry.
func bakeInto(ctx context.Context, out io.Writer, spec ImageSpec, img SnapshotImage, dir string) error {
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".tmp-")
	if err != nil {
		return fmt.Errorf("create image cache: %w", err)
	}
	defer os.RemoveAll(tmp)
	fmt.Fprintf(out, "baking %s guest snapshot %s (cached for later runs)\n", spec.Memory, img.Ref)
	cmd := exec.CommandContext(ctx, filepath.Join(spec.BinDir, "cocoonctl"), "bake",
		"--guest", spec.Guest, "--memory", spec.Memory, "--vcpus", "1", "--cmdline", Cmdline, "--disk-slots", strconv.Itoa(spec.DiskSlots),
		"--out", filepath.Join(tmp, "link"), "--image", img.Ref, "--archive", filepath.Join(tmp, "image.tar"),
		"--timeout", bakeTimeout.String())
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("bake snapshot image with %s: %w", cmd.Path, err)
	}
	os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("publish snapshot image: %w", err)
	}
	return nil
}

// imageKey hashes what the baked snapshot depends on.
func imageKey(ctx context.Context, guest, memory string, slots int) (string, error) {
	info, err := os.ReadFile(filepath.Join(guest, "BUILDINFO"))
	if err != nil {
		return "", fmt.Errorf("guest build: %w (make guest)", err)
	}
	cfg, err := config.Load("")
	if err != nil {
		return "", err
	}
	build, err := qemu.New(cfg.QEMU).Build(ctx)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	parts := []string{string(info), memory, Cmdline, build}
	if slots > 0 {
		// Only then, so the keys of images without slots stay as they were.
		parts = append(parts, "disk-slots="+strconv.Itoa(slots))
	}
	for _, part := range parts {
		fmt.Fprintf(h, "%d:%s\n", len(part), part)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}
