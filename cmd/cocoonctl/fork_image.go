package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// chainImage is a task's image that is a cocoon snapshot chain: one link
// per layer, every layer in the content store.
type chainImage struct {
	name     string
	manifest ocispec.Manifest
	config   ocispec.Image
	// top is the link of the last layer: a fork's diff must follow it.
	top *chain.Link
}

// loadChainImage reads the image name and checks it is a chain image.
func loadChainImage(ctx context.Context, cl *client.Client, name string) (*chainImage, error) {
	if name == "" {
		return nil, errors.New("the container names no image to fork from")
	}
	img, err := cl.ImageService().Get(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("the container's image %s: %w", name, err)
	}
	cs := cl.ContentStore()
	ci := &chainImage{name: name}
	if ci.manifest, err = images.Manifest(ctx, cs, img.Target, platforms.Default()); err != nil {
		return nil, fmt.Errorf("manifest of image %s: %w", name, err)
	}
	b, err := content.ReadBlob(ctx, cs, ci.manifest.Config)
	if err != nil {
		return nil, fmt.Errorf("config of image %s: %w", name, err)
	}
	if err := json.Unmarshal(b, &ci.config); err != nil {
		return nil, fmt.Errorf("config of image %s: %w", name, err)
	}
	if err := ci.checkLayers(ctx, cs); err != nil {
		return nil, err
	}
	if ci.top, err = layerLink(ctx, cs, ci.manifest.Layers[len(ci.manifest.Layers)-1]); err != nil {
		return nil, fmt.Errorf("top layer of image %s: %w", name, err)
	}
	return ci, nil
}

// contentInfo is the part of a content store checkLayers asks.
type contentInfo interface {
	Info(ctx context.Context, dgst digest.Digest) (content.Info, error)
}

// checkLayers checks every layer is a link layer, present in cs.
func (ci *chainImage) checkLayers(ctx context.Context, cs contentInfo) error {
	notChain := func(why string) error {
		return fmt.Errorf("image %s is not a cocoon snapshot-chain image (%s): forking a task of an ordinary OCI image, which runs on its runtime class's base snapshot with the image as a disk, is not supported yet", ci.name, why)
	}
	layers := ci.manifest.Layers
	switch {
	case ci.config.Config.Labels[chain.LabelHypervisor] == "":
		return notChain("its config has no " + chain.LabelHypervisor + " label")
	case len(layers) == 0 || len(ci.config.RootFS.DiffIDs) != len(layers):
		return notChain(fmt.Sprintf("%d layers, %d diff IDs", len(layers), len(ci.config.RootFS.DiffIDs)))
	}
	for i, l := range layers {
		if l.Annotations[chain.AnnotationLinkID] == "" || l.MediaType != ocispec.MediaTypeImageLayer {
			return notChain(fmt.Sprintf("layer %d, %s, has no %s annotation or is compressed", i, l.MediaType, chain.AnnotationLinkID))
		}
		if _, err := cs.Info(ctx, l.Digest); err != nil {
			return fmt.Errorf("layer %d (%s) of image %s: a fork references its parent's layers, so they must be in the content store: %w", i, l.Digest, ci.name, err)
		}
	}
	return nil
}

// layerLink reads the link a link layer starts with.
func layerLink(ctx context.Context, cs content.Store, desc ocispec.Descriptor) (*chain.Link, error) {
	ra, err := cs.ReaderAt(ctx, desc)
	if err != nil {
		return nil, err
	}
	defer ra.Close()
	l, err := chain.LayerLink(content.NewReader(ra))
	if err != nil {
		return nil, err
	}
	if id := desc.Annotations[chain.AnnotationLinkID]; id != l.ID().String() {
		return nil, fmt.Errorf("layer %s holds link %s, its annotation says %s", desc.Digest, l.ID(), id)
	}
	return l, nil
}

// maxCheckpointFiles bounds the entries of a checkpoint: a link's three
// files and a few state files.
const maxCheckpointFiles = 32

// extractCheckpoint writes the files of the checkpoint containerd stored
// (a tar of the directory the shim wrote the link into) into dir. Only
// plain files are taken.
func extractCheckpoint(ctx context.Context, cs content.Store, descs []*types.Descriptor, dir string) error {
	i := slices.IndexFunc(descs, func(d *types.Descriptor) bool { return d.MediaType == images.MediaTypeContainerd1Checkpoint })
	if i < 0 {
		return errors.New("containerd stored no checkpoint of the task")
	}
	ra, err := cs.ReaderAt(ctx, ocispec.Descriptor{MediaType: descs[i].MediaType, Digest: digest.Digest(descs[i].Digest), Size: descs[i].Size})
	if err != nil {
		return fmt.Errorf("read checkpoint: %w", err)
	}
	defer ra.Close()
	tr := tar.NewReader(content.NewReader(ra))
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read checkpoint: %w", err)
		}
		name := strings.TrimPrefix(path.Clean("/"+hdr.Name), "/")
		switch {
		case hdr.Typeflag == tar.TypeDir && name == "":
			continue
		case n >= maxCheckpointFiles:
			return fmt.Errorf("checkpoint has more than %d entries", maxCheckpointFiles)
		case hdr.Typeflag != tar.TypeReg || name == "" || strings.Contains(name, "/"):
			return fmt.Errorf("checkpoint entry %q (type %c): want the link's plain files", hdr.Name, hdr.Typeflag)
		}
		if err := writeFrom(filepath.Join(dir, name), tr); err != nil {
			return fmt.Errorf("extract checkpoint: %w", err)
		}
	}
}

func writeFrom(path string, r io.Reader) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// registerFork checks the link in dir follows parent (a full link, which a
// driver writes where it cannot make a diff, starts a chain of its own),
// stores it as a layer, and creates image name = parent's layers + it,
// unpacked into snapshotter. It returns the link and the layer count.
func registerFork(ctx context.Context, cl *client.Client, parent *chainImage, dir, name, snapshotter string) (*chain.Link, int, error) {
	l, layers, err := checkForkLink(ctx, parent, dir)
	if err != nil {
		return nil, 0, err
	}
	cs := cl.ContentStore()
	layer, err := writeLayerBlob(ctx, cs, dir)
	if err != nil {
		return nil, 0, err
	}
	layers = append(layers, layer)
	manifest, err := writeManifest(ctx, cs, forkConfig(parent.config, layers, l), layers)
	if err != nil {
		return nil, 0, err
	}
	img, err := cl.ImageService().Create(ctx, images.Image{Name: name, Target: manifest})
	if err != nil {
		return nil, 0, fmt.Errorf("create image %s: %w", name, err)
	}
	if err := client.NewImage(cl, img).Unpack(ctx, snapshotter); err != nil {
		if derr := cl.ImageService().Delete(ctx, name); derr != nil {
			err = errors.Join(err, fmt.Errorf("delete image %s: %w", name, derr))
		}
		return nil, 0, fmt.Errorf("unpack image %s into %s: %w", name, snapshotter, err)
	}
	return l, len(layers), nil
}

// checkForkLink checks the link in dir can top the image's chain: a diff
// on its top link (same parent, memory layout, hypervisor and guest), or a
// full link, which starts a chain of its own; its data must match its
// digest. It returns the link and the layers it follows.
func checkForkLink(ctx context.Context, parent *chainImage, dir string) (*chain.Link, []ocispec.Descriptor, error) {
	l, err := chain.ReadLink(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("the task's checkpoint: %w", err)
	}
	var after *chain.Link
	layers := []ocispec.Descriptor{}
	if l.Kind == chain.KindDiff {
		after, layers = parent.top, slices.Clone(parent.manifest.Layers)
	}
	if _, err := chain.Validate(dir, after); err != nil {
		return nil, nil, fmt.Errorf("the task's link does not follow image %s: %w", parent.name, err)
	}
	if err := chain.VerifyData(ctx, dir, l); err != nil {
		return nil, nil, fmt.Errorf("the task's link: %w", err)
	}
	return l, layers, nil
}

// writeLayerBlob stores the link in dir as a layer blob.
func writeLayerBlob(ctx context.Context, cs content.Store, dir string) (ocispec.Descriptor, error) {
	ref := make([]byte, 8)
	rand.Read(ref)
	w, err := content.OpenWriter(ctx, cs, content.WithRef("cocoon-fork-"+hex.EncodeToString(ref)))
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("store link layer: %w", err)
	}
	defer w.Close()
	desc, _, err := chain.WriteLayer(w, dir)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("store link layer: %w", err)
	}
	if err := w.Commit(ctx, desc.Size, desc.Digest); err != nil && !errdefs.IsAlreadyExists(err) {
		return ocispec.Descriptor{}, fmt.Errorf("store link layer: %w", err)
	}
	return desc, nil
}

// forkConfig is parent's image config for layers, ending with link l.
func forkConfig(parent ocispec.Image, layers []ocispec.Descriptor, l *chain.Link) ocispec.Image {
	c := parent
	now := time.Now().UTC()
	c.Created = &now
	c.RootFS = ocispec.RootFS{Type: "layers"}
	for _, d := range layers {
		c.RootFS.DiffIDs = append(c.RootFS.DiffIDs, d.Digest) // uncompressed layers
	}
	c.Config.Labels = maps.Clone(parent.Config.Labels)
	c.Config.Labels[chain.LabelHypervisor], c.Config.Labels[chain.LabelGuestOS] = l.Hypervisor, l.GuestOS
	c.History = nil
	if l.Kind == chain.KindDiff && len(parent.History) > 0 {
		c.History = append(slices.Clone(parent.History), ocispec.History{Created: &now, CreatedBy: "cocoonctl fork"})
	}
	return c
}

// writeManifest stores config and the manifest of layers, labelled so
// that containerd's collector keeps what the manifest references.
func writeManifest(ctx context.Context, cs content.Store, config ocispec.Image, layers []ocispec.Descriptor) (ocispec.Descriptor, error) {
	cfg, err := writeJSON(ctx, cs, ocispec.MediaTypeImageConfig, config, nil)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	labels := map[string]string{"containerd.io/gc.ref.content.config": cfg.Digest.String()}
	for i, l := range layers {
		labels[fmt.Sprintf("containerd.io/gc.ref.content.l.%d", i)] = l.Digest.String()
	}
	m := ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		Config: cfg, Layers: layers,
	}
	return writeJSON(ctx, cs, ocispec.MediaTypeImageManifest, m, labels)
}

func writeJSON(ctx context.Context, cs content.Store, mediaType string, v any, labels map[string]string) (ocispec.Descriptor, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("encode %s: %w", mediaType, err)
	}
	desc := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(b), Size: int64(len(b))}
	if err := content.WriteBlob(ctx, cs, desc.Digest.String(), bytes.NewReader(b), desc, content.WithLabels(labels)); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("store %s: %w", mediaType, err)
	}
	return desc, nil
}
