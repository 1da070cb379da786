package bench

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// busyboxBinary is Debian busybox-static's binary, the only program in the
// ordinary image the runc and ordinary arms run.
const busyboxBinary = "/bin/busybox"

// busyboxImage builds an ordinary one-layer OCI image named name (static
// busybox, a shell and sleep, mount points, and padBytes of random data in
// /data/pad so its size can be chosen), imports it into cl and unpacks it
// into each snapshotter. It needs no registry.
func busyboxImage(ctx context.Context, cl *client.Client, name string, padBytes int64, snapshotters ...string) (client.Image, error) {
	layer, err := busyboxLayer(padBytes)
	if err != nil {
		return nil, err
	}
	var archive bytes.Buffer
	if err := writeLayout(&archive, name, layer); err != nil {
		return nil, fmt.Errorf("busybox image %s: %w", name, err)
	}
	imgs, err := cl.Import(ctx, &archive)
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

// busyboxLayer is the image's only layer, an uncompressed tar.
func busyboxLayer(padBytes int64) ([]byte, error) {
	bin, err := os.ReadFile(busyboxBinary)
	if err != nil {
		return nil, fmt.Errorf("busybox image: %w (install busybox-static)", err)
	}
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	mtime := time.Unix(0, 0)
	dirs := []string{"bin", "data", "dev", "etc", "proc", "run", "sys", "tmp"}
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: mtime}); err != nil {
			return nil, err
		}
	}
	for _, link := range []string{"sh", "sleep"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + link, Linkname: "busybox", ModTime: mtime}); err != nil {
			return nil, err
		}
	}
	pad := make([]byte, padBytes)
	if _, err := rand.Read(pad); err != nil {
		return nil, fmt.Errorf("busybox image: %w", err)
	}
	files := []struct {
		name string
		mode int64
		data []byte
	}{
		{"bin/busybox", 0o755, bin},
		{"etc/passwd", 0o644, []byte("root:x:0:0:root:/:/bin/sh\n")},
		{"etc/group", 0o644, []byte("root:x:0:\n")},
		{"data/pad", 0o644, pad},
	}
	for _, f := range files {
		h := &tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: f.mode, Size: int64(len(f.data)), ModTime: mtime}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// writeLayout writes an OCI image layout tar of one image, named for
// containerd's importer, with layer as its only layer.
func writeLayout(w io.Writer, name string, layer []byte) error {
	layerDesc := blobDesc(ocispec.MediaTypeImageLayer, layer)
	config, err := json.Marshal(ocispec.Image{
		Platform: ocispec.Platform{Architecture: "amd64", OS: "linux"},
		Config:   ocispec.ImageConfig{Env: []string{"PATH=/bin"}},
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{layerDesc.Digest}},
	})
	if err != nil {
		return err
	}
	configDesc := blobDesc(ocispec.MediaTypeImageConfig, config)
	manifest, err := json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		Config: configDesc, Layers: []ocispec.Descriptor{layerDesc},
	})
	if err != nil {
		return err
	}
	manifestDesc := blobDesc(ocispec.MediaTypeImageManifest, manifest)
	manifestDesc.Annotations = map[string]string{"io.containerd.image.name": name}
	index, err := json.Marshal(ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{manifestDesc},
	})
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	entries := []struct {
		name string
		data []byte
	}{
		{ocispec.ImageLayoutFile, []byte(`{"imageLayoutVersion":"` + ocispec.ImageLayoutVersion + `"}`)},
		{"index.json", index},
		{blobPath(layerDesc), layer},
		{blobPath(configDesc), config},
		{blobPath(manifestDesc), manifest},
	}
	for _, e := range entries {
		if err := tw.WriteHeader(&tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.data))}); err != nil {
			return err
		}
		if _, err := tw.Write(e.data); err != nil {
			return err
		}
	}
	return tw.Close()
}

func blobDesc(mediaType string, data []byte) ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(data), Size: int64(len(data))}
}

func blobPath(d ocispec.Descriptor) string {
	return "blobs/" + d.Digest.Algorithm().String() + "/" + d.Digest.Encoded()
}
