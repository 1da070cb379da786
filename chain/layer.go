package chain

import (
	"fmt"
	"io"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// WriteLayer writes the link in dir to w as the image layer Pack makes of
// it (an uncompressed tar, link.json first) and returns the layer's
// descriptor, annotated with the link ID, and the link. The link is
// validated on its own first; its place in a chain is the caller's to
// check (Validate).
func WriteLayer(w io.Writer, dir string) (ocispec.Descriptor, *Link, error) {
	l, err := ValidateDir(dir)
	if err != nil {
		return ocispec.Descriptor{}, nil, err
	}
	dg := digest.SHA256.Digester()
	cw := &countWriter{w: io.MultiWriter(w, dg.Hash())}
	if err := writeLayer(cw, dir, l); err != nil {
		return ocispec.Descriptor{}, nil, err
	}
	desc := ocispec.Descriptor{
		MediaType: ocispec.MediaTypeImageLayer, Digest: dg.Digest(), Size: cw.n,
		Annotations: map[string]string{AnnotationLinkID: l.ID().String()},
	}
	return desc, l, nil
}

// LayerLink reads the link.json a link layer starts with, so a layer in a
// content store can be placed in a chain without unpacking it.
func LayerLink(r io.Reader) (*Link, error) {
	l, err := peekLink(r)
	if err != nil {
		return nil, fmt.Errorf("read link layer: %w", err)
	}
	return l, nil
}
