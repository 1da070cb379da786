package testimage

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// storeImage writes img's layers, config and manifest into cs and returns
// the manifest's descriptor.
func storeImage(ctx context.Context, cs content.Store, img Image) (ocispec.Descriptor, error) {
	if len(img.Layers) == 0 {
		return ocispec.Descriptor{}, fmt.Errorf("no layers: want at least one")
	}
	layers := make([]ocispec.Descriptor, 0, len(img.Layers))
	diffIDs := make([]digest.Digest, 0, len(img.Layers))
	for i, l := range img.Layers {
		data, err := l.Tar()
		if err != nil {
			return ocispec.Descriptor{}, fmt.Errorf("layer %d: %w", i, err)
		}
		desc, err := writeBlob(ctx, cs, ocispec.MediaTypeImageLayer, data)
		if err != nil {
			return ocispec.Descriptor{}, fmt.Errorf("layer %d: %w", i, err)
		}
		// Uncompressed layers: the diff ID is the blob's own digest.
		layers, diffIDs = append(layers, desc), append(diffIDs, desc.Digest)
	}
	config, err := writeJSON(ctx, cs, ocispec.MediaTypeImageConfig, ocispec.Image{
		Platform: platform,
		Config:   img.Config,
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: diffIDs},
	})
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("config: %w", err)
	}
	manifest, err := writeJSON(ctx, cs, ocispec.MediaTypeImageManifest, ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    config,
		Layers:    layers,
	})
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("manifest: %w", err)
	}
	manifest.Platform = &platform
	return manifest, nil
}

func writeJSON(ctx context.Context, cs content.Store, mediaType string, v any) (ocispec.Descriptor, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("encode %s: %w", mediaType, err)
	}
	return writeBlob(ctx, cs, mediaType, data)
}

func writeBlob(ctx context.Context, cs content.Store, mediaType string, data []byte) (ocispec.Descriptor, error) {
	desc := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(data), Size: int64(len(data))}
	if err := content.WriteBlob(ctx, cs, desc.Digest.String(), bytes.NewReader(data), desc); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("store %s: %w", mediaType, err)
	}
	return desc, nil
}
