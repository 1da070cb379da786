package chain

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path"
	"path/filepath"
	"time"

	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Image annotations and labels Pack writes.
const (
	// AnnotationLinkID on a layer descriptor is the ID of the link it holds.
	AnnotationLinkID = "io.cocoon.link.id"
	// LabelHypervisor and LabelGuestOS in the image config describe the chain.
	LabelHypervisor = "io.cocoon.hypervisor"
	LabelGuestOS    = "io.cocoon.guest-os"
	// annotationImageName is containerd's images.AnnotationImageName.
	annotationImageName = "io.containerd.image.name"
)

// epoch is every tar entry's mtime, so one chain always packs to the same
// layer digests.
var epoch = time.Unix(0, 0).UTC()

var imagePlatform = ocispec.Platform{Architecture: "amd64", OS: "linux"}

// Pack validates the chain in linkDirs (oldest first) and writes it to w as
// an OCI image layout tar named ref: one uncompressed tar layer per link.
// Layers are streamed twice (digest, then copy), never held in memory.
func Pack(ctx context.Context, ref string, linkDirs []string, w io.Writer) error {
	name, tag, err := imageName(ref)
	if err != nil {
		return err
	}
	links, err := ValidateChain(linkDirs)
	if err != nil {
		return fmt.Errorf("pack: %w", err)
	}
	p := packer{tw: tar.NewWriter(w)}
	if err := p.header(); err != nil {
		return err
	}
	layers := make([]ocispec.Descriptor, len(links))
	for i, l := range links {
		if err := ctx.Err(); err != nil {
			return err
		}
		if layers[i], err = p.layer(linkDirs[i], l); err != nil {
			return err
		}
	}
	top := links[len(links)-1]
	manifest, err := p.manifest(layers, top)
	if err != nil {
		return err
	}
	manifest.Platform = &imagePlatform
	manifest.Annotations = map[string]string{annotationImageName: name, ocispec.AnnotationRefName: tag}
	index := ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{manifest},
	}
	if err := p.jsonFile(ocispec.ImageIndexFile, index); err != nil {
		return err
	}
	if err := p.tw.Close(); err != nil {
		return fmt.Errorf("pack: %w", err)
	}
	return nil
}

// imageName normalizes ref as containerd's importer does and returns it with
// the OCI ref name (its tag).
func imageName(ref string) (string, string, error) {
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return "", "", fmt.Errorf("pack: image name %q: %w", ref, err)
	}
	tag := named.String()
	if t, ok := named.(reference.Tagged); ok {
		tag = t.Tag()
	}
	return named.String(), tag, nil
}

type packer struct {
	tw *tar.Writer
}

func (p *packer) header() error {
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		hdr := &tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: epoch}
		if err := p.tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("pack: %w", err)
		}
	}
	return p.jsonFile(ocispec.ImageLayoutFile, ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
}

// layer writes one link as a layer blob: a first pass digests it, the
// second copies it and must produce the same digest.
func (p *packer) layer(dir string, l *Link) (ocispec.Descriptor, error) {
	dg := digest.SHA256.Digester()
	cw := &countWriter{w: dg.Hash()}
	if err := writeLayer(cw, dir, l); err != nil {
		return ocispec.Descriptor{}, err
	}
	desc := ocispec.Descriptor{
		MediaType: ocispec.MediaTypeImageLayer, Digest: dg.Digest(), Size: cw.n,
		Annotations: map[string]string{AnnotationLinkID: l.ID().String()},
	}
	if err := p.blobHeader(desc); err != nil {
		return ocispec.Descriptor{}, err
	}
	again := digest.SHA256.Digester()
	if err := writeLayer(io.MultiWriter(p.tw, again.Hash()), dir, l); err != nil {
		return ocispec.Descriptor{}, err
	}
	if again.Digest() != desc.Digest {
		return ocispec.Descriptor{}, fmt.Errorf("pack: link %s changed while packing", dir)
	}
	return desc, nil
}

// manifest writes the image config and manifest blobs and returns the
// manifest's descriptor.
func (p *packer) manifest(layers []ocispec.Descriptor, top *Link) (ocispec.Descriptor, error) {
	img := ocispec.Image{
		Platform: imagePlatform,
		Config: ocispec.ImageConfig{Labels: map[string]string{
			LabelHypervisor: top.Hypervisor, LabelGuestOS: top.GuestOS,
		}},
		RootFS: ocispec.RootFS{Type: "layers"},
	}
	for _, d := range layers {
		img.RootFS.DiffIDs = append(img.RootFS.DiffIDs, d.Digest)
	}
	config, err := p.jsonBlob(ocispec.MediaTypeImageConfig, img)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	return p.jsonBlob(ocispec.MediaTypeImageManifest, ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		Config: config, Layers: layers,
	})
}

func (p *packer) blobHeader(d ocispec.Descriptor) error {
	hdr := &tar.Header{
		Typeflag: tar.TypeReg, Name: path.Join("blobs", d.Digest.Algorithm().String(), d.Digest.Encoded()),
		Mode: 0o444, Size: d.Size, ModTime: epoch,
	}
	if err := p.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("pack: %w", err)
	}
	return nil
}

func (p *packer) jsonBlob(mediaType string, v any) (ocispec.Descriptor, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("pack: %w", err)
	}
	d := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(b), Size: int64(len(b))}
	if err := p.blobHeader(d); err != nil {
		return ocispec.Descriptor{}, err
	}
	if _, err := p.tw.Write(b); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("pack: %w", err)
	}
	return d, nil
}

func (p *packer) jsonFile(name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("pack: %w", err)
	}
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o444, Size: int64(len(b)), ModTime: epoch}
	if err := p.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("pack: %w", err)
	}
	if _, err := p.tw.Write(b); err != nil {
		return fmt.Errorf("pack: %w", err)
	}
	return nil
}

// writeLayer writes a link dir as a tar: link.json first (so readers find
// it without reading the memory), then the memory files and state files.
func writeLayer(w io.Writer, dir string, l *Link) error {
	tw := tar.NewWriter(w)
	names := append([]string{LinkFile, ExtentsFile, DataFile}, l.StateFiles...)
	for _, name := range names {
		if err := addFile(tw, filepath.Join(dir, name), name, fileBound(name, l)); err != nil {
			return fmt.Errorf("pack: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("pack %s: %w", dir, err)
	}
	return nil
}

// fileBound is the largest size the file name of link l may have.
func fileBound(name string, l *Link) int64 {
	switch name {
	case LinkFile:
		return maxLinkJSON
	case ExtentsFile:
		return maxExtentsSize(l.MemoryBytes, l.PageSize)
	case DataFile:
		return l.Memory.DataBytes
	}
	return MaxStateFile
}

// addFile copies the link file src into tw as name; src is opened as
// OpenLinkFile does, since Validate's checks do not hold a file open.
func addFile(tw *tar.Writer, src, name string, maxSize int64) error {
	f, err := OpenLinkFile(src, maxSize)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: fi.Size(), ModTime: epoch}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("write %s: %w", src, err)
	}
	if _, err := io.CopyN(tw, f, fi.Size()); err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}
