package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// forkLink writes a link of a memory of mem bytes starting with content
// into a new dir: full, or a diff on parentDir.
func forkLink(t *testing.T, parentDir, content string, mem int64) string {
	t.Helper()
	memPath := filepath.Join(t.TempDir(), "memory")
	if err := os.WriteFile(memPath, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(memPath, mem); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	meta := chain.Meta{Hypervisor: "qemu", GuestOS: "linux", VCPUs: 1}
	var err error
	if parentDir == "" {
		_, err = chain.WriteFull(context.Background(), memPath, meta, dir)
	} else {
		_, err = chain.WriteDiffPages(context.Background(), memPath, []chain.Extent{{Offset: 0, Length: 4096}}, parentDir, meta, dir)
	}
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// A task's link tops its image only as a diff on the image's top link, with
// the same memory layout, or as a full link, which starts a chain alone.
func TestCheckForkLink(t *testing.T) {
	ctx := context.Background()
	top := forkLink(t, "", "base", 1<<20)
	topLink, err := chain.ReadLink(top)
	if err != nil {
		t.Fatal(err)
	}
	parent := &chainImage{name: "example.com/base:1", top: topLink,
		manifest: ocispec.Manifest{Layers: []ocispec.Descriptor{{Digest: digest.FromString("base layer")}}}}
	resized := func() string {
		dir := forkLink(t, top, "forked", 1<<20)
		path := filepath.Join(dir, chain.LinkFile)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		b = []byte(strings.Replace(string(b), `"memoryBytes": 1048576`, `"memoryBytes": 2097152`, 1))
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	for _, tt := range []struct {
		name, dir, want string
		layers          int
	}{
		{"diff on the top", forkLink(t, top, "forked", 1<<20), "", 1},
		{"full", forkLink(t, "", "forked", 1<<20), "", 0},
		{"diff on another chain", forkLink(t, forkLink(t, "", "other", 1<<20), "forked", 1<<20), "parent digest mismatch", 0},
		{"layout changed", resized(), "memory size changes inside the chain", 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l, layers, err := checkForkLink(ctx, parent, tt.dir)
			if tt.want != "" {
				if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "example.com/base:1") {
					t.Fatalf("err %v, want one containing %q and naming the image", err, tt.want)
				}
				return
			}
			if err != nil || l == nil || len(layers) != tt.layers {
				t.Fatalf("link %v, %d parent layers, %v; want %d", l, len(layers), err, tt.layers)
			}
		})
	}
}

// blobs is a content store's Info over a set of digests.
type blobs map[digest.Digest]bool

func (b blobs) Info(_ context.Context, d digest.Digest) (content.Info, error) {
	if !b[d] {
		return content.Info{}, fmt.Errorf("content %s: %w", d, errdefs.ErrNotFound)
	}
	return content.Info{Digest: d}, nil
}

// Only a chain image forks: an ordinary OCI image (the task then runs on a
// base snapshot with the image as its disk) is refused, saying so, and a
// chain image must have its layers in the content store.
func TestCheckLayers(t *testing.T) {
	link := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayer, Digest: digest.FromString("link"),
		Annotations: map[string]string{chain.AnnotationLinkID: digest.FromString("id").String()}}
	plain := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayerGzip, Digest: digest.FromString("busybox")}
	chainConfig := ocispec.Image{Config: ocispec.ImageConfig{Labels: map[string]string{chain.LabelHypervisor: "qemu"}}}
	image := func(cfg ocispec.Image, layers ...ocispec.Descriptor) *chainImage {
		for _, l := range layers {
			cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, l.Digest)
		}
		return &chainImage{name: "example.com/img:1", config: cfg, manifest: ocispec.Manifest{Layers: layers}}
	}
	all := blobs{link.Digest: true, plain.Digest: true}
	for _, tt := range []struct {
		name  string
		image *chainImage
		store blobs
		want  string
	}{
		{"chain image", image(chainConfig, link), all, ""},
		{"ordinary image", image(ocispec.Image{}, plain), all, "not a cocoon snapshot-chain image"},
		{"ordinary layer on a chain", image(chainConfig, link, plain), all, "layer 1"},
		{"layer gone", image(chainConfig, link), blobs{}, "must be in the content store"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.image.checkLayers(context.Background(), tt.store)
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want one containing %q", err, tt.want)
			}
		})
	}
}
