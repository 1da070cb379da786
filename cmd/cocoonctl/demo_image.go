package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/qemu"
)

// defaultBakeTimeout bounds baking the demo and bench snapshot.
const defaultBakeTimeout = 5 * time.Minute

// snapshotImage is a baked guest snapshot, cached between runs: its chain
// link directory and an OCI image archive of it for `ctr images import`.
type snapshotImage struct {
	Ref     string
	LinkDir string
	Archive string
	Cached  bool
}

// imageSpec says which snapshot to bake and where to cache it.
type imageSpec struct {
	guest  string // guest build dir (vmlinuz, initramfs.cpio.gz, BUILDINFO)
	cache  string // parent dir of the cached images
	memory string // guest memory, e.g. 512M
}

// ensureImage returns the cached snapshot image for spec, baking and
// packing it first if the guest build, memory size, kernel command line or
// QEMU build changed. The key covers the guest's BUILDINFO, which records
// the kernel, busybox and agent hashes.
func ensureImage(ctx context.Context, out io.Writer, spec imageSpec) (snapshotImage, error) {
	guest, err := filepath.Abs(spec.guest)
	if err != nil {
		return snapshotImage{}, fmt.Errorf("guest dir: %w", err)
	}
	// Boot adds the TSC hint a TCG guest needs; the key covers the rest.
	cmdline := defaultCmdline
	key, err := imageKey(ctx, guest, spec.memory, cmdline)
	if err != nil {
		return snapshotImage{}, err
	}
	dir := filepath.Join(spec.cache, key)
	img := snapshotImage{
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
	if err := bakeInto(ctx, out, guest, spec.memory, cmdline, img, dir); err != nil {
		return snapshotImage{}, err
	}
	return img, nil
}

// bakeInto bakes img into a temp dir next to dir and renames it into place,
// so an interrupted bake never leaves a half-written cache entry.
func bakeInto(ctx context.Context, out io.Writer, guest, memory, cmdline string, img snapshotImage, dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("create image cache: %w", err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".tmp-")
	if err != nil {
		return fmt.Errorf("create image cache: %w", err)
	}
	defer os.RemoveAll(tmp)
	fmt.Fprintf(out, "baking %s guest snapshot %s (cached for later runs)\n", memory, img.Ref)
	err = bake(ctx, out, out, bakeOptions{
		guest: guest, memory: memory, vcpus: 1, cmdline: cmdline,
		out: filepath.Join(tmp, "link"), image: img.Ref, archive: filepath.Join(tmp, "image.tar"),
		timeout: defaultBakeTimeout,
	})
	if err != nil {
		return fmt.Errorf("bake snapshot image: %w", err)
	}
	os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("publish snapshot image: %w", err)
	}
	return nil
}

// imageKey hashes what the baked snapshot depends on.
func imageKey(ctx context.Context, guest, memory, cmdline string) (string, error) {
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
	for _, part := range []string{string(info), memory, cmdline, build} {
		fmt.Fprintf(h, "%d:%s\n", len(part), part)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}
