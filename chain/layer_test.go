package chain

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// WriteLayer makes the layer Pack puts in an image for the same link, and
// LayerLink reads the link back from it.
func TestWriteLayer(t *testing.T) {
	root := t.TempDir()
	c := buildChain(t, root, 64)
	var archive bytes.Buffer
	if err := Pack(context.Background(), "cocoon/layer:v1", c.dirs, &archive); err != nil {
		t.Fatal(err)
	}
	files := untarAll(t, archive.Bytes())
	for i, dir := range c.dirs {
		var buf bytes.Buffer
		desc, l, err := WriteLayer(&buf, dir)
		if err != nil {
			t.Fatal(err)
		}
		if desc.Size != int64(buf.Len()) || desc.Annotations[AnnotationLinkID] != l.ID().String() {
			t.Fatalf("link %d: descriptor %+v for %d bytes of link %s", i, desc, buf.Len(), l.ID())
		}
		if packed := blob(t, files, desc.Digest); !bytes.Equal(packed, buf.Bytes()) {
			t.Fatalf("link %d: WriteLayer's layer %s is not the one Pack wrote", i, desc.Digest)
		}
		got, err := LayerLink(bytes.NewReader(buf.Bytes()))
		if err != nil || got.ID() != l.ID() {
			t.Fatalf("link %d: LayerLink read %v, %v; want %s", i, got, err, l.ID())
		}
	}
	if _, _, err := WriteLayer(&bytes.Buffer{}, root); err == nil {
		t.Error("WriteLayer of a directory without a link succeeded")
	}
	if _, err := LayerLink(strings.NewReader("not a tar")); err == nil {
		t.Error("LayerLink of a non-tar succeeded")
	}
}
