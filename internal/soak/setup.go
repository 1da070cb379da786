package soak

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/containerd/containerd/v2/client"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testimage"
)

// busyboxRef names the ordinary image the soak builds.
const busyboxRef = "localhost/cocoon-soak/busybox:1"

// setup connects to containerd and the snapshotter and imports the images
// into the cocoon snapshotter: the snapshot image, the pods' when it runs
// pods, and, when it runs ordinary images or pods, a two-layer busybox
// image it builds. It lays out the
// files the hostile inputs name.
func (s *soak) setup(ctx context.Context) error {
	var err error
	if s.client, err = s.stack.Client(); err != nil {
		return err
	}
	if s.snConn, err = dialSnapshotter(s.stack.SnapshotterAddress); err != nil {
		return err
	}
	if s.hostile, err = newHostileFixture(); err != nil {
		return err
	}
	s.images = map[ImageKind]client.Image{}
	if s.images[ImageChain], err = s.importImage(ctx, s.opts.Image); err != nil {
		return err
	}
	if s.opts.Pods > 0 {
		if _, err := s.importImage(ctx, s.opts.PodImage); err != nil {
			return err
		}
		if s.podOptions, err = s.writePodConfig(); err != nil {
			return err
		}
	}
	// The pools' drain (drainPools) runs an ordinary image too.
	if s.opts.OrdinaryShare == 0 && s.opts.Pods == 0 && s.opts.Spares == 0 {
		return nil
	}
	bb, err := testimage.Busybox(testimage.BusyboxOptions{
		Name: busyboxRef, Layers: 2, Config: ocispec.ImageConfig{Cmd: []string{"sh"}},
	})
	if err != nil {
		return err
	}
	s.randomContent = bb.RandomContent
	archive := filepath.Join(s.stack.Dir, "busybox.tar")
	if err := testimage.WriteArchiveFile(ctx, archive, bb.Image); err != nil {
		return err
	}
	s.images[ImageOrdinary], err = s.importImage(ctx, Image{Ref: busyboxRef, Archive: archive})
	return err
}

func (s *soak) importImage(ctx context.Context, img Image) (client.Image, error) {
	if _, err := s.stack.Ctr(ctx, "images", "import", "--snapshotter", devstack.Snapshotter, img.Archive); err != nil {
		return nil, err
	}
	image, err := s.client.GetImage(ctx, img.Ref)
	if err != nil {
		return nil, fmt.Errorf("imported image %s: %w", img.Ref, err)
	}
	return image, nil
}
