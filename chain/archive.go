package chain

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path"
	"strings"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Bounds on what ReadArchive reads into memory: the JSON blobs (index,
// manifest, config) and the number of tar entries it indexes (a chain image
// has one blob per link plus a manifest and a config).
const (
	maxMetadataBlob   = 4 << 20
	maxArchiveEntries = 1 << 16
)

// Archive is what ReadArchive found in an OCI image layout tar of a chain.
type Archive struct {
	// Name is the image name (io.containerd.image.name, else the OCI ref name).
	Name     string
	Manifest ocispec.Manifest
	Config   ocispec.Image
	// Links are the layers' links, oldest first.
	Links []*Link
}

// ReadArchive reads an archive Pack wrote (or any OCI layout tar of one
// chain image), verifying the digest of every blob the index references,
// the index → manifest → config structure, that each diff ID is its
// (uncompressed) layer's digest, and that the layers' links form a chain.
// A first pass notes where each blob lies without reading it; then only
// the referenced blobs are read, the layers streamed: memory use does not
// grow with the archive, and blobs nothing references are never read.
func ReadArchive(file string) (*Archive, error) {
	f, err := openRegular(file, 0, math.MaxInt64)
	if err != nil {
		return nil, fmt.Errorf("read archive: %w", err)
	}
	defer f.Close()
	c, err := scanArchive(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	a, err := c.resolve()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return a, nil
}

// archiveContents is what the first pass over the tar found.
type archiveContents struct {
	f      io.ReaderAt
	layout bool
	index  []byte
	blobs  map[digest.Digest]blobSection
}

// blobSection is where a blob's bytes lie in the archive.
type blobSection struct {
	name      string
	off, size int64
}

func (b blobSection) reader(r io.ReaderAt) io.Reader { return io.NewSectionReader(r, b.off, b.size) }

// scanArchive reads the tar's headers, the layout file and the index, and
// notes each blob's section; the tar reader seeks past the blobs' bytes.
func scanArchive(f *os.File) (*archiveContents, error) {
	c := &archiveContents{f: f, blobs: map[digest.Digest]blobSection{}}
	tr := tar.NewReader(f)
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			return c, nil
		}
		if err != nil {
			return nil, fmt.Errorf("not an OCI image layout tar: %w", err)
		}
		if n == maxArchiveEntries {
			return nil, fmt.Errorf("more than %d tar entries: not a chain image", maxArchiveEntries)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		switch name := path.Clean(hdr.Name); {
		case name == ocispec.ImageLayoutFile:
			if err := c.readLayout(tr, hdr.Size, name); err != nil {
				return nil, err
			}
		case name == ocispec.ImageIndexFile:
			if c.index != nil {
				return nil, fmt.Errorf("%s appears twice", name)
			}
			if c.index, err = readSmall(tr, hdr.Size, name, maxMetadataBlob); err != nil {
				return nil, err
			}
		case strings.HasPrefix(name, "blobs/"):
			if err := c.noteBlob(f, hdr, name); err != nil {
				return nil, err
			}
		}
	}
}

func (c *archiveContents) readLayout(r io.Reader, size int64, name string) error {
	b, err := readSmall(r, size, name, maxMetadataBlob)
	if err != nil {
		return err
	}
	var l ocispec.ImageLayout
	if err := json.Unmarshal(b, &l); err != nil || l.Version != ocispec.ImageLayoutVersion {
		return fmt.Errorf("%s: want image layout version %s", name, ocispec.ImageLayoutVersion)
	}
	c.layout = true
	return nil
}

// noteBlob records where the blob of the entry hdr, just read, lies.
func (c *archiveContents) noteBlob(f *os.File, hdr *tar.Header, name string) error {
	rest, _ := strings.CutPrefix(name, "blobs/")
	dgst := digest.Digest(strings.Replace(rest, "/", ":", 1))
	if err := dgst.Validate(); err != nil {
		return fmt.Errorf("%s: not a blob name: %w", name, err)
	}
	if _, ok := c.blobs[dgst]; ok {
		return fmt.Errorf("%s appears twice", name)
	}
	for k := range hdr.PAXRecords {
		// A sparse entry's bytes in the tar are not its content.
		if strings.HasPrefix(k, "GNU.sparse.") {
			return fmt.Errorf("%s: a sparse tar entry, want a plain file", name)
		}
	}
	off, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return fmt.Errorf("read %s: %w", name, err)
	}
	c.blobs[dgst] = blobSection{name: name, off: off, size: hdr.Size}
	return nil
}

// peekLink reads link.json, the first entry of a link layer.
func peekLink(r io.Reader) (*Link, error) {
	tr := tar.NewReader(r)
	hdr, err := tr.Next()
	if err != nil {
		return nil, fmt.Errorf("not a tar layer: %w", err)
	}
	if path.Clean(hdr.Name) != LinkFile {
		return nil, fmt.Errorf("first entry is %q, want %s", hdr.Name, LinkFile)
	}
	b, err := readSmall(tr, hdr.Size, LinkFile, maxLinkJSON)
	if err != nil {
		return nil, err
	}
	l, err := ParseLink(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", LinkFile, err)
	}
	return l, nil
}

func readSmall(r io.Reader, size int64, name string, maxSize int64) ([]byte, error) {
	if size > maxSize {
		return nil, fmt.Errorf("%s: %d bytes, larger than %d", name, size, maxSize)
	}
	b, err := io.ReadAll(io.LimitReader(r, size))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	if int64(len(b)) != size {
		return nil, fmt.Errorf("read %s: %d of its %d bytes", name, len(b), size)
	}
	return b, nil
}

// resolve follows index → manifest → config and layers.
func (c *archiveContents) resolve() (*Archive, error) {
	if !c.layout {
		return nil, errors.New("no oci-layout file: not an OCI image layout")
	}
	if c.index == nil {
		return nil, fmt.Errorf("no %s", ocispec.ImageIndexFile)
	}
	var idx ocispec.Index
	if err := json.Unmarshal(c.index, &idx); err != nil {
		return nil, fmt.Errorf("parse %s: %w", ocispec.ImageIndexFile, err)
	}
	if len(idx.Manifests) != 1 {
		return nil, fmt.Errorf("%s lists %d manifests, want 1", ocispec.ImageIndexFile, len(idx.Manifests))
	}
	md := idx.Manifests[0]
	a := &Archive{Name: md.Annotations[annotationImageName]}
	if a.Name == "" {
		a.Name = md.Annotations[ocispec.AnnotationRefName]
	}
	if err := c.json(md, ocispec.MediaTypeImageManifest, &a.Manifest); err != nil {
		return nil, err
	}
	if err := c.json(a.Manifest.Config, ocispec.MediaTypeImageConfig, &a.Config); err != nil {
		return nil, err
	}
	if err := c.layers(a); err != nil {
		return nil, err
	}
	if err := checkLinks(a.Links); err != nil {
		return nil, err
	}
	return a, nil
}

// blob returns where the blob of descriptor d lies, checking its size.
func (c *archiveContents) blob(d ocispec.Descriptor) (blobSection, error) {
	b, ok := c.blobs[d.Digest]
	if !ok {
		return blobSection{}, fmt.Errorf("blob %s (%s) is missing", d.Digest, d.MediaType)
	}
	if b.size != d.Size {
		return blobSection{}, fmt.Errorf("blob %s is %d bytes, its descriptor says %d", d.Digest, b.size, d.Size)
	}
	return b, nil
}

// json reads, verifies and decodes the metadata blob of descriptor d.
func (c *archiveContents) json(d ocispec.Descriptor, mediaType string, v any) error {
	if d.MediaType != mediaType {
		return fmt.Errorf("descriptor %s has media type %q, want %q", d.Digest, d.MediaType, mediaType)
	}
	b, err := c.blob(d)
	if err != nil {
		return err
	}
	data, err := readSmall(b.reader(c.f), b.size, b.name, maxMetadataBlob)
	if err != nil {
		return err
	}
	if digest.FromBytes(data) != d.Digest {
		return fmt.Errorf("%s: content does not match its digest", b.name)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("parse %s %s: %w", mediaType, d.Digest, err)
	}
	return nil
}

func (c *archiveContents) layers(a *Archive) error {
	ids := a.Config.RootFS.DiffIDs
	if len(ids) != len(a.Manifest.Layers) {
		return fmt.Errorf("config has %d diff IDs for %d layers", len(ids), len(a.Manifest.Layers))
	}
	for i, d := range a.Manifest.Layers {
		if d.MediaType != ocispec.MediaTypeImageLayer {
			return fmt.Errorf("layer %d has media type %q, want %q (uncompressed)", i, d.MediaType, ocispec.MediaTypeImageLayer)
		}
		if ids[i] != d.Digest {
			return fmt.Errorf("layer %d: diff ID %s is not the layer digest %s", i, ids[i], d.Digest)
		}
		l, err := c.layer(d)
		if err != nil {
			return fmt.Errorf("layer %d %s: %w", i, d.Digest, err)
		}
		if id := d.Annotations[AnnotationLinkID]; id != "" && id != l.ID().String() {
			return fmt.Errorf("layer %d: annotation says link %s, layer holds %s", i, id, l.ID())
		}
		a.Links = append(a.Links, l)
	}
	return nil
}

// layer streams the layer blob of d once: its link.json is parsed on the
// way, and the whole blob must match the digest.
func (c *archiveContents) layer(d ocispec.Descriptor) (*Link, error) {
	b, err := c.blob(d)
	if err != nil {
		return nil, err
	}
	v := d.Digest.Verifier()
	tee := io.TeeReader(b.reader(c.f), v)
	l, linkErr := peekLink(tee)
	if _, err := io.Copy(io.Discard, tee); err != nil {
		return nil, fmt.Errorf("read %s: %w", b.name, err)
	}
	if !v.Verified() {
		return nil, fmt.Errorf("%s: content does not match its digest", b.name)
	}
	if linkErr != nil {
		return nil, linkErr
	}
	return l, nil
}
