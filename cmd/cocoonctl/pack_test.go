package main

import (
	"archive/tar"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

func TestPackArchiveStructure(t *testing.T) {
	root := t.TempDir()
	dirs, _ := makeTestChain(t, root)
	archive := filepath.Join(root, "chain.tar")
	if _, err := runChainCmd(t, "pack", append([]string{"--name", "example.com/snap/app:v1", "--out", archive}, dirs...)...); err != nil {
		t.Fatal(err)
	}
	blobs, index := readLayout(t, archive)
	var idx ocispec.Index
	unmarshal(t, index, &idx)
	if len(idx.Manifests) != 1 || idx.Manifests[0].Annotations["io.containerd.image.name"] != "example.com/snap/app:v1" {
		t.Fatalf("index %+v", idx)
	}
	var m ocispec.Manifest
	unmarshal(t, blobs[idx.Manifests[0].Digest], &m)
	var img ocispec.Image
	unmarshal(t, blobs[m.Config.Digest], &img)
	if len(m.Layers) != len(dirs) || len(img.RootFS.DiffIDs) != len(dirs) {
		t.Fatalf("%d layers, %d diff IDs, want %d", len(m.Layers), len(img.RootFS.DiffIDs), len(dirs))
	}
	for i, l := range m.Layers {
		if l.MediaType != ocispec.MediaTypeImageLayer || img.RootFS.DiffIDs[i] != l.Digest {
			t.Errorf("layer %d: %s %s, diff ID %s", i, l.MediaType, l.Digest, img.RootFS.DiffIDs[i])
		}
		if _, ok := blobs[l.Digest]; !ok {
			t.Errorf("layer %d blob %s missing", i, l.Digest)
		}
	}
	fi, err := os.Stat(archive)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o644 {
		t.Errorf("archive mode %v", fi.Mode().Perm())
	}
}

// readLayout returns an OCI layout tar's blobs, each checked against its
// name, and its index.json.
func readLayout(t *testing.T, archive string) (map[digest.Digest][]byte, []byte) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	blobs := map[digest.Digest][]byte{}
	var index []byte
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return blobs, index
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		switch dir, name := filepath.Split(hdr.Name); {
		case hdr.Name == "index.json":
			index = b
		case dir == "blobs/sha256/":
			d := digest.NewDigestFromEncoded(digest.SHA256, name)
			if digest.FromBytes(b) != d {
				t.Fatalf("blob %s has digest %s", name, digest.FromBytes(b))
			}
			blobs[d] = b
		}
	}
}

func unmarshal(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
}

// A pack that fails midway leaves neither the archive nor a temp file.
func TestPackFailureLeavesNothing(t *testing.T) {
	root := t.TempDir()
	dirs, _ := makeTestChain(t, root)
	if err := os.Remove(filepath.Join(dirs[1], "memory.data")); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	archive := filepath.Join(out, "chain.tar")
	if _, err := runChainCmd(t, "pack", append([]string{"--name", "example.com/snap/app:v1", "--out", archive}, dirs...)...); err == nil {
		t.Fatal("pack of a chain with a missing memory.data succeeded")
	}
	if left, _ := os.ReadDir(out); len(left) != 0 {
		t.Errorf("failed pack left %v in the output dir", left)
	}
}
