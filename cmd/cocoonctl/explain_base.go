package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/defaults"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/baseimage"
)

// baseOptions ask explain for the base snapshot the runtime class gives
// an ordinary image's VM (restore.base_image, or the one of
// restore.base_images that fits), picked as the shim picks it.
type baseOptions struct {
	base                   bool
	podMemory, memoryLimit sizeFlag
	address, namespace     string
	// stage stages a base image, as the shim does; through containerd
	// when nil.
	stage func(ctx context.Context, cfg config.Config, image string) (*explainBase, int64, error)
}

func (b *baseOptions) flags(fs *flag.FlagSet) {
	ns := os.Getenv(namespaces.NamespaceEnvVar)
	if ns == "" {
		ns = "k8s.io"
	}
	fs.BoolVar(&b.base, "base", false, "plan for the runtime class's base snapshot (restore.base_image, or the one of restore.base_images the shim would pick) instead of --link or --staged: stages it through containerd, then lets it go")
	fs.Var(&b.podMemory, "pod-memory", "with --base: a pod's memory `size` (its VM gets the smallest base that holds it)")
	fs.Var(&b.memoryLimit, "memory-limit", "with --base: a container's memory limit `size` (its own VM gets the largest base the limit holds)")
	fs.StringVar(&b.address, "address", defaults.DefaultAddress, "with --base: containerd's gRPC `socket`")
	fs.StringVar(&b.namespace, "namespace", ns, "with --base: the containerd `namespace` the base images are in (default $"+namespaces.NamespaceEnvVar+", else k8s.io)")
}

// fit is the VM the base is for, as the shim's fitOf has it.
func (b *baseOptions) fit() (baseimage.Fit, error) {
	switch {
	case b.podMemory > 0 && b.memoryLimit > 0:
		return baseimage.Fit{}, errors.New("give one of --pod-memory and --memory-limit: a VM is a pod's or a container's own")
	case b.podMemory > 0:
		return baseimage.Fit{Pod: true, Limit: int64(b.podMemory)}, nil
	}
	return baseimage.Fit{Limit: int64(b.memoryLimit)}, nil
}

// explainBase is a staged base snapshot: its top link, its staged chain
// (nil for a link alone) and how to let it go.
type explainBase struct {
	image   string
	dir     string
	link    *chain.Link
	staged  *chain.Staged
	release func() error
}

func (b *explainBase) Release() error { return b.release() }

// pick stages the base the shim would restore a VM of b's fit from, and
// says why it is that one.
func (b *baseOptions) pick(ctx context.Context, cfg config.Config) (*explainBase, string, error) {
	bases := cfg.Restore.Bases()
	if len(bases) == 0 {
		return nil, "", errors.New("--base: the config sets neither restore.base_image nor restore.base_images")
	}
	fit, err := b.fit()
	if err != nil {
		return nil, "", err
	}
	stage := b.stage
	if stage == nil {
		stage = b.stageThroughContainerd
	}
	base, why, err := baseimage.Pick(ctx, bases, fit, func(ctx context.Context, image string) (*explainBase, int64, error) {
		return stage(ctx, cfg, image)
	})
	if err != nil {
		return nil, "", err
	}
	if why == "" {
		why = fmt.Sprintf("base snapshot %s: the runtime class's only one (restore.base_image); the memory budget judges the VM's limits against it", base.image)
	}
	return base, why, nil
}

// stageThroughContainerd stages image as the shim stages a base, under a
// key of cocoonctl's own.
func (b *baseOptions) stageThroughContainerd(ctx context.Context, cfg config.Config, image string) (*explainBase, int64, error) {
	if _, err := os.Stat(b.address); err != nil {
		return nil, 0, fmt.Errorf("containerd socket: %w (--address)", err)
	}
	cl, err := client.New(b.address)
	if err != nil {
		return nil, 0, fmt.Errorf("connect to containerd at %s: %w", b.address, err)
	}
	snap, err := baseimage.Stage(ctx, cl, b.namespace, cfg.Restore.BaseSnapshotter, image, fmt.Sprintf("cocoonctl-explain-%d", os.Getpid()))
	if err != nil {
		return nil, 0, errors.Join(err, cl.Close())
	}
	release := func() error { return errors.Join(snap.Release(), cl.Close()) }
	top := snap.Staged.Top()
	return &explainBase{image: image, dir: snap.Dir, link: top, staged: snap.Staged, release: release}, top.MemoryBytes, nil
}

// sizeFlag is a flag holding a size such as 512M or 1GiB.
type sizeFlag config.Size

func (s *sizeFlag) String() string {
	b, _ := config.Size(*s).MarshalText()
	return string(b)
}

func (s *sizeFlag) Set(v string) error {
	return (*config.Size)(s).UnmarshalText([]byte(v))
}
