package bench

import (
	"context"
	"fmt"
	"io"

	"github.com/containerd/containerd/v2/client"
	"github.com/opencontainers/image-spec/identity"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
)

// busyboxName is the ordinary image the runc and ordinary arms run.
const busyboxName = "localhost/cocoon-bench/busybox:1"

// addBusybox imports the ordinary busybox image into the stack, unpacked
// into the snapshotters the arms that run it use. On the cocoon snapshotter
// its filesystem image is built here, so the cells measure a node that has
// converted it once (conversions measure that first use).
func (s *shimStack) addBusybox(ctx context.Context, snapshotters []string) error {
	img, err := busyboxImage(ctx, s.cl, busyboxName, 0, snapshotters...)
	if err != nil {
		return err
	}
	s.busybox = img
	for _, sn := range snapshotters {
		if sn != devstack.Snapshotter {
			continue
		}
		top, err := chainID(ctx, img)
		if err != nil {
			return err
		}
		if _, err := prepareOnce(ctx, s.cl.SnapshotService(sn), "warm-busybox", top); err != nil {
			return fmt.Errorf("build the busybox image's filesystem: %w", err)
		}
	}
	return nil
}

// chainID is the chain ID of img's layers: the parent of its containers'
// snapshots.
func chainID(ctx context.Context, img client.Image) (string, error) {
	diffIDs, err := img.RootFS(ctx)
	if err != nil {
		return "", fmt.Errorf("layers of %s: %w", img.Name(), err)
	}
	return identity.ChainID(diffIDs).String(), nil
}

// Conversion is the first use of an ordinary image on a node: the cocoon
// snapshotter builds the filesystem image of its layers (erofs) in the
// first Prepare of a container snapshot; later Prepares stage it by hard
// link.
type Conversion struct {
	PadBytes   int64   `json:"padBytes"`   // random data added to busybox
	ImageBytes int64   `json:"imageBytes"` // the image's content (layers, config, manifest)
	FirstMs    float64 `json:"firstPrepareMs"`
	CachedMs   float64 `json:"cachedPrepareMs"`
}

// measureConversions imports one busybox image per pad size into the
// cocoon snapshotter and times its first and second container Prepare.
func measureConversions(ctx context.Context, out io.Writer, s *shimStack, pads []int64) ([]Conversion, error) {
	var cs []Conversion
	sn := s.cl.SnapshotService(devstack.Snapshotter)
	for i, pad := range pads {
		img, err := busyboxImage(ctx, s.cl, fmt.Sprintf("localhost/cocoon-bench/convert:%d", i), pad, devstack.Snapshotter)
		if err != nil {
			return nil, err
		}
		c := Conversion{PadBytes: pad}
		if c.ImageBytes, err = img.Size(ctx); err != nil {
			return nil, fmt.Errorf("size of %s: %w", img.Name(), err)
		}
		top, err := chainID(ctx, img)
		if err != nil {
			return nil, err
		}
		first, err := prepareOnce(ctx, sn, fmt.Sprintf("convert-%d", i), top)
		if err != nil {
			return nil, err
		}
		cached, err := prepareOnce(ctx, sn, fmt.Sprintf("convert-%d", i), top)
		if err != nil {
			return nil, err
		}
		c.FirstMs, c.CachedMs = ms(first), ms(cached)
		fmt.Fprintf(out, "ordinary image of %.1f MiB: first Prepare %.0f ms (erofs build), then %.1f ms cached\n",
			float64(c.ImageBytes)/(1<<20), c.FirstMs, c.CachedMs)
		cs = append(cs, c)
	}
	return cs, nil
}
