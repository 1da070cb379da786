package bench

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"

	"github.com/containerd/containerd/v2/client"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testimage"
)

// padFile holds the random data that sets an image's size.
const padFile = "/data/pad"

// busyboxImage builds an ordinary one-layer busybox image named name, with
// padBytes of random data in padFile so its size can be chosen, imports it
// into cl and unpacks it into each snapshotter. It needs no registry.
func busyboxImage(ctx context.Context, cl *client.Client, name string, padBytes int64, snapshotters ...string) (client.Image, error) {
	bb, err := testimage.Busybox(testimage.BusyboxOptions{Name: name, Layers: 1})
	if err != nil {
		return nil, err
	}
	if padBytes > 0 {
		pad := make([]byte, padBytes)
		if _, err := rand.Read(pad); err != nil {
			return nil, fmt.Errorf("busybox image %s: %w", name, err)
		}
		bb.Layers[0] = append(bb.Layers[0], testimage.File(padFile, 0o644, pad))
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(testimage.WriteArchive(ctx, pw, bb.Image)) }()
	imgs, err := cl.Import(ctx, pr)
	pr.Close()
	if err != nil {
		return nil, fmt.Errorf("import busybox image %s: %w", name, err)
	}
	if len(imgs) != 1 {
		return nil, fmt.Errorf("import busybox image %s: got %d images, want 1", name, len(imgs))
	}
	img := client.NewImage(cl, imgs[0])
	for _, sn := range snapshotters {
		if err := img.Unpack(ctx, sn); err != nil {
			return nil, fmt.Errorf("unpack busybox image %s into %s: %w", name, sn, err)
		}
	}
	return img, nil
}
