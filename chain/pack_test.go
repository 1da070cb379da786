package chain

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

func TestPackStructure(t *testing.T) {
	root := t.TempDir()
	c := buildChain(t, root, 64)
	var buf bytes.Buffer
	if err := Pack(context.Background(), "cocoon/test:v1", c.dirs, &buf); err != nil {
		t.Fatal(err)
	}
	files := untarAll(t, buf.Bytes())
	for name, b := range files {
		if strings.HasPrefix(name, "blobs/sha256/") && digest.FromBytes(b).Encoded() != path.Base(name) {
			t.Errorf("%s: content digest %s", name, digest.FromBytes(b))
		}
	}
	var idx ocispec.Index
	decode(t, files["index.json"], &idx)
	if len(idx.Manifests) != 1 {
		t.Fatalf("%d manifests", len(idx.Manifests))
	}
	md := idx.Manifests[0]
	if got := md.Annotations["io.containerd.image.name"]; got != "docker.io/cocoon/test:v1" {
		t.Errorf("image name %q", got)
	}
	if got := md.Annotations[ocispec.AnnotationRefName]; got != "v1" {
		t.Errorf("ref name %q", got)
	}
	var m ocispec.Manifest
	decode(t, blob(t, files, md.Digest), &m)
	var img ocispec.Image
	decode(t, blob(t, files, m.Config.Digest), &img)
	if img.OS != "linux" || img.Architecture != "amd64" || len(img.RootFS.DiffIDs) != len(c.dirs) {
		t.Fatalf("config %+v", img)
	}
	for i, l := range m.Layers {
		if img.RootFS.DiffIDs[i] != l.Digest || l.MediaType != ocispec.MediaTypeImageLayer {
			t.Errorf("layer %d %s %s, diff ID %s", i, l.MediaType, l.Digest, img.RootFS.DiffIDs[i])
		}
		layer := untarAll(t, blob(t, files, l.Digest))
		for _, name := range []string{LinkFile, ExtentsFile, DataFile, "qemu.state"} {
			want, err := os.ReadFile(filepath.Join(c.dirs[i], name))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(layer[name], want) {
				t.Errorf("layer %d: %s differs from the link dir", i, name)
			}
		}
	}
}

func TestPackRoundTrip(t *testing.T) {
	root := t.TempDir()
	c := buildChain(t, root, 64)
	archive := filepath.Join(root, "chain.tar")
	packTo(t, archive, c.dirs)
	a, err := ReadArchive(archive)
	if err != nil {
		t.Fatal(err)
	}
	if a.Name != "docker.io/library/chain:latest" || len(a.Links) != 3 {
		t.Fatalf("archive %q with %d links", a.Name, len(a.Links))
	}
	for i, l := range a.Links {
		if l.ID() != mustRead(t, c.dirs[i]).ID() {
			t.Errorf("link %d ID %s", i, l.ID())
		}
	}
	again := filepath.Join(root, "again.tar")
	packTo(t, again, c.dirs)
	b1, _ := os.ReadFile(archive)
	b2, _ := os.ReadFile(again)
	if !bytes.Equal(b1, b2) {
		t.Error("packing the same chain twice gave different archives")
	}
}

func TestPackRejectsBadInput(t *testing.T) {
	root := t.TempDir()
	c := buildChain(t, root, 16)
	if err := Pack(context.Background(), "Bad Name", c.dirs, io.Discard); err == nil || !strings.Contains(err.Error(), "image name") {
		t.Errorf("bad name: %v", err)
	}
	if err := Pack(context.Background(), "x", c.dirs[1:], io.Discard); err == nil || !strings.Contains(err.Error(), "needs its parent") {
		t.Errorf("chain without its full link: %v", err)
	}
}

func TestReadArchiveRejectsCorruptBlob(t *testing.T) {
	root := t.TempDir()
	c := buildChain(t, root, 16)
	archive := filepath.Join(root, "chain.tar")
	packTo(t, archive, c.dirs)
	b, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(b, []byte(extentsMagic))
	b[i] ^= 0xff
	if err := os.WriteFile(archive, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadArchive(archive); err == nil || !strings.Contains(err.Error(), "does not match its digest") {
		t.Fatalf("corrupt blob: %v", err)
	}
}

func packTo(t *testing.T, file string, dirs []string) {
	t.Helper()
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := Pack(context.Background(), "chain", dirs, f); err != nil {
		t.Fatal(err)
	}
}

func untarAll(t *testing.T, b []byte) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag == tar.TypeReg {
			if files[hdr.Name], err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func blob(t *testing.T, files map[string][]byte, d digest.Digest) []byte {
	t.Helper()
	b, ok := files["blobs/sha256/"+d.Encoded()]
	if !ok {
		t.Fatalf("blob %s missing", d)
	}
	return b
}

func decode(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
}
