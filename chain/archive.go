package chain

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// maxMetadataBlob bounds the JSON blobs (index, manifest, config) read into memory.
const maxMetadataBlob = 4 << 20

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
// chain image), verifying every blob's digest, the index → manifest → config
// structure, that each diff ID is its (uncompressed) layer's digest, and that
// the layers' links form a chain. It streams: memory data is not held.
func ReadArchive(file string) (*Archive, error) {
	f, err := os.Open(file)
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

// archiveContents is what one pass over the tar collects.
type archiveContents struct {
	layout bool
	index  []byte
	small  map[digest.Digest][]byte // blobs small enough to be metadata
	links  map[digest.Digest]*Link  // blobs that are link layers
	errs   map[digest.Digest]error  // why a blob is not a link layer
}

func scanArchive(r io.Reader) (*archiveContents, error) {
	c := &archiveContents{
		small: map[digest.Digest][]byte{}, links: map[digest.Digest]*Link{}, errs: map[digest.Digest]error{},
	}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return c, nil
		}
		if err != nil {
			return nil, fmt.Errorf("not an OCI image layout tar: %w", err)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		switch name := path.Clean(hdr.Name); {
		case name == ocispec.ImageLayoutFile:
			var l ocispec.ImageLayout
			if err := json.NewDecoder(io.LimitReader(tr, maxMetadataBlob)).Decode(&l); err != nil || l.Version != ocispec.ImageLayoutVersion {
				return nil, fmt.Errorf("%s: want image layout version %s", name, ocispec.ImageLayoutVersion)
			}
			c.layout = true
		case name == ocispec.ImageIndexFile:
			if c.index, err = readSmall(tr, hdr.Size, name); err != nil {
				return nil, err
			}
		case strings.HasPrefix(name, "blobs/"):
			if err := c.blob(tr, hdr, name); err != nil {
				return nil, err
			}
		}
	}
}

// blob verifies one blob's digest and keeps it if small, or its link if it
// is a link layer.
func (c *archiveContents) blob(r io.Reader, hdr *tar.Header, name string) error {
	rest, _ := strings.CutPrefix(name, "blobs/")
	dgst := digest.Digest(strings.Replace(rest, "/", ":", 1))
	if err := dgst.Validate(); err != nil {
		return fmt.Errorf("%s: not a blob name: %w", name, err)
	}
	v := dgst.Verifier()
	tee := io.TeeReader(r, v)
	var src io.Reader = tee
	if hdr.Size <= maxMetadataBlob {
		b, err := io.ReadAll(tee)
		if err != nil {
			return fmt.Errorf("read %s: %w", name, err)
		}
		c.small[dgst] = b
		src = bytes.NewReader(b)
	}
	if l, err := peekLink(src); err != nil {
		c.errs[dgst] = err
	} else {
		c.links[dgst] = l
	}
	if _, err := io.Copy(io.Discard, tee); err != nil {
		return fmt.Errorf("read %s: %w", name, err)
	}
	if !v.Verified() {
		return fmt.Errorf("%s: content does not match its digest", name)
	}
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
	b, err := readSmall(tr, hdr.Size, LinkFile)
	if err != nil {
		return nil, err
	}
	l, err := ParseLink(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", LinkFile, err)
	}
	return l, nil
}

func readSmall(r io.Reader, size int64, name string) ([]byte, error) {
	if size > maxMetadataBlob {
		return nil, fmt.Errorf("%s: %d bytes, larger than %d", name, size, maxMetadataBlob)
	}
	b, err := io.ReadAll(io.LimitReader(r, maxMetadataBlob))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
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

func (c *archiveContents) json(d ocispec.Descriptor, mediaType string, v any) error {
	if d.MediaType != mediaType {
		return fmt.Errorf("descriptor %s has media type %q, want %q", d.Digest, d.MediaType, mediaType)
	}
	b, ok := c.small[d.Digest]
	if !ok {
		return fmt.Errorf("blob %s (%s) is missing", d.Digest, mediaType)
	}
	if int64(len(b)) != d.Size {
		return fmt.Errorf("blob %s is %d bytes, its descriptor says %d", d.Digest, len(b), d.Size)
	}
	if err := json.Unmarshal(b, v); err != nil {
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
		l, ok := c.links[d.Digest]
		if !ok {
			if err := c.errs[d.Digest]; err != nil {
				return fmt.Errorf("layer %d %s: %w", i, d.Digest, err)
			}
			return fmt.Errorf("layer %d %s is missing", i, d.Digest)
		}
		if id := d.Annotations[AnnotationLinkID]; id != "" && id != l.ID().String() {
			return fmt.Errorf("layer %d: annotation says link %s, layer holds %s", i, id, l.ID())
		}
		a.Links = append(a.Links, l)
	}
	return nil
}
