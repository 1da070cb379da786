// Package testimage writes OCI image archives for tests, with no registry:
// images made of plain tar layers, named so that `ctr images import` (and
// so the CRI plugin) knows them by reference. It builds two images the
// test tiers need: a pause image (a static pause program, the pod sandbox
// image) and a busybox image (static busybox, a non-root user, a file with
// random content, layers with a whiteout).
//
//	pause, err := testimage.Pause(ctx, "localhost/cocoon-test/pause:1", tmp)
//	bb, err := testimage.Busybox(testimage.BusyboxOptions{Name: "localhost/cocoon-test/busybox:1", Layers: 2})
//	err = testimage.WriteArchiveFile(ctx, archive, pause, bb.Image)
//	// ctr -n k8s.io images import --snapshotter overlayfs archive
package testimage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/v2/core/images/archive"
	"github.com/containerd/containerd/v2/pkg/atomicfile"
	"github.com/containerd/containerd/v2/plugins/content/local"
	"github.com/distribution/reference"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Image is one image to write: its reference, its config (entrypoint,
// cmd, user, env, working dir, labels) and its layers, lowest first.
type Image struct {
	// Name is the image reference ctr and the CRI plugin know it by, e.g.
	// "localhost/cocoon-test/pause:1".
	Name   string
	Config ocispec.ImageConfig
	Layers []Layer
}

// platform is every image's: the machines the tests run on.
var platform = ocispec.Platform{Architecture: "amd64", OS: "linux"}

// WriteArchive writes imgs to w as one OCI image layout tar, each image's
// manifest named by its Name (containerd's io.containerd.image.name and the
// OCI ref name), so `ctr images import` creates every image under its name.
func WriteArchive(ctx context.Context, w io.Writer, imgs ...Image) error {
	if len(imgs) == 0 {
		return errors.New("write image archive: no images")
	}
	dir, err := os.MkdirTemp("", "testimage-")
	if err != nil {
		return fmt.Errorf("write image archive: %w", err)
	}
	defer os.RemoveAll(dir)
	cs, err := local.NewStore(dir)
	if err != nil {
		return fmt.Errorf("write image archive: open content store: %w", err)
	}
	opts := []archive.ExportOpt{archive.WithSkipDockerManifest()}
	for _, img := range imgs {
		if _, err := reference.ParseNormalizedNamed(img.Name); err != nil {
			return fmt.Errorf("write image archive: image name %q: %w: want a reference such as localhost/test/pause:1", img.Name, err)
		}
		desc, err := storeImage(ctx, cs, img)
		if err != nil {
			return fmt.Errorf("write image %s: %w", img.Name, err)
		}
		opts = append(opts, archive.WithManifest(desc, img.Name))
	}
	if err := archive.Export(ctx, cs, w, opts...); err != nil {
		return fmt.Errorf("write image archive: %w", err)
	}
	return nil
}

// WriteArchiveFile is WriteArchive to a file at path, replaced atomically.
func WriteArchiveFile(ctx context.Context, path string, imgs ...Image) error {
	f, err := atomicfile.New(path, 0o644)
	if err != nil {
		return fmt.Errorf("write image archive: %w", err)
	}
	if err := WriteArchive(ctx, f, imgs...); err != nil {
		return errors.Join(err, f.Cancel())
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write image archive %s: %w", filepath.Base(path), err)
	}
	return nil
}
