package stackrun

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/containerd/v2/client"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
)

// StartStack starts a private containerd whose shims run with cfg and
// imports img into it on the cocoon snapshotter.
func StartStack(ctx context.Context, binDir string, cfg *config.Config, img SnapshotImage) (*devstack.Stack, client.Image, error) {
	stack, err := devstack.Start(ctx, devstack.Options{BinDir: binDir, Config: cfg, LogLevel: "info"})
	if err != nil {
		return nil, nil, err
	}
	image, err := importImage(ctx, stack, img)
	if err != nil {
		return nil, nil, errors.Join(err, stack.Close())
	}
	return stack, image, nil
}

func importImage(ctx context.Context, stack *devstack.Stack, img SnapshotImage) (client.Image, error) {
	if _, err := stack.Ctr(ctx, "images", "import", "--snapshotter", devstack.Snapshotter, img.Archive); err != nil {
		return nil, err
	}
	cl, err := stack.Client()
	if err != nil {
		return nil, err
	}
	image, err := cl.GetImage(ctx, img.Ref)
	if err != nil {
		return nil, fmt.Errorf("imported image: %w", err)
	}
	return image, nil
}

// AnnotatedConfig is the default cocoon config with the restore-mode
// annotation allowed to choose the mode, and every task restoring its own
// VM: the demo shows restores, and the bench's pooled arms turn the pool
// on in configs of their own.
func AnnotatedConfig() (*config.Config, error) {
	cfg, err := config.Load("")
	if err != nil {
		return nil, err
	}
	cfg.Restore.AllowAnnotation = true
	cfg.Shim.PooledVM = false
	return &cfg, nil
}
