package chain

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
)

// rewriteArchive copies the tar src to dst through edit, which gets each
// entry and returns the entries to write in its place.
func rewriteArchive(t testing.TB, src, dst string, edit func(hdr *tar.Header, b []byte) []tarEntry) {
	t.Helper()
	in, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	tr := tar.NewReader(bytes.NewReader(in))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range edit(hdr, b) {
			if err := tw.WriteHeader(e.hdr); err != nil {
				t.Fatal(err)
			}
			if _, err := tw.Write(e.data); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	raw := bytes.ReplaceAll(out.Bytes(), []byte("GNU.sparsX."), []byte("GNU.sparse."))
	if err := os.WriteFile(dst, raw, 0o644); err != nil {
		t.Fatal(err)
	}
}

type tarEntry struct {
	hdr  *tar.Header
	data []byte
}

func keep(hdr *tar.Header, b []byte) []tarEntry { return []tarEntry{{hdr, b}} }

func blobEntry(b []byte) tarEntry {
	return tarEntry{&tar.Header{Typeflag: tar.TypeReg, Name: "blobs/sha256/" + digest.FromBytes(b).Encoded(), Mode: 0o444, Size: int64(len(b))}, b}
}

func TestReadArchiveHostile(t *testing.T) {
	root := t.TempDir()
	c := buildChain(t, root, 16)
	packed := filepath.Join(root, "chain.tar")
	packTo(t, packed, c.dirs)
	tests := []struct {
		name    string
		edit    func(hdr *tar.Header, b []byte) []tarEntry
		wantErr string
	}{
		{"unreferenced blob with a wrong digest is never read", func(hdr *tar.Header, b []byte) []tarEntry {
			if hdr.Name != "index.json" {
				return keep(hdr, b)
			}
			bad := blobEntry([]byte("unreferenced"))
			bad.data = []byte("tampered!!!!")
			return []tarEntry{bad, {hdr, b}}
		}, ""},
		{"a blob twice", func(hdr *tar.Header, b []byte) []tarEntry {
			if !strings.HasPrefix(hdr.Name, "blobs/sha256/") {
				return keep(hdr, b)
			}
			return []tarEntry{{hdr, b}, {hdr, b}}
		}, "appears twice"},
		{"index.json twice", func(hdr *tar.Header, b []byte) []tarEntry {
			if hdr.Name != "index.json" {
				return keep(hdr, b)
			}
			return []tarEntry{{hdr, b}, {hdr, b}}
		}, "index.json appears twice"},
		{"sparse blob entry", func(hdr *tar.Header, b []byte) []tarEntry {
			if strings.HasPrefix(hdr.Name, "blobs/sha256/") {
				// tar.Writer drops GNU.sparse records: write a stand-in
				// rewriteArchive renames.
				hdr.PAXRecords = map[string]string{"GNU.sparsX.major": "2"}
				hdr.Format = tar.FormatPAX
			}
			return keep(hdr, b)
		}, "sparse"},
		{"too many entries", func(hdr *tar.Header, b []byte) []tarEntry {
			if hdr.Name != "oci-layout" {
				return keep(hdr, b)
			}
			out := []tarEntry{{hdr, b}}
			for range maxArchiveEntries {
				out = append(out, tarEntry{&tar.Header{Typeflag: tar.TypeDir, Name: "d/", Mode: 0o755}, nil})
			}
			return out
		}, "more than 65536 tar entries"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			archive := filepath.Join(t.TempDir(), "a.tar")
			rewriteArchive(t, packed, archive, tt.edit)
			a, err := ReadArchive(archive)
			if tt.wantErr == "" {
				if err != nil || len(a.Links) != len(c.dirs) {
					t.Fatalf("ReadArchive: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("ReadArchive error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

// FuzzReadArchive: arbitrary archive bytes never panic, and an accepted
// archive holds a chain.
func FuzzReadArchive(f *testing.F) {
	root := f.TempDir()
	c := buildChain(f, root, 2)
	packed := filepath.Join(root, "chain.tar")
	out, err := os.Create(packed)
	if err != nil {
		f.Fatal(err)
	}
	if err := Pack(f.Context(), "chain", c.dirs[:1], out); err != nil {
		f.Fatal(err)
	}
	out.Close()
	b, err := os.ReadFile(packed)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add(b[:len(b)/2])
	f.Add([]byte{})
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(dir, "archive.tar")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		a, err := ReadArchive(path)
		if err != nil {
			return
		}
		if err := checkLinks(a.Links); err != nil {
			t.Fatalf("accepted an archive whose links are no chain: %v", err)
		}
	})
}
