package snapshotter

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/diff/apply"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/archive"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// entry is one tar entry of a test layer.
type entry struct {
	name     string
	typ      byte // tar.TypeReg (default), TypeDir, TypeSymlink, TypeLink
	mode     int64
	uid, gid int
	body     string
	link     string
}

var layerTime = time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)

// layerTar builds an uncompressed layer tar. Entries get distinct mtimes so
// that a tree comparison sees a lost mtime.
func layerTar(t testing.TB, entries []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i, e := range entries {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := e.mode
		if mode == 0 {
			mode = 0o644
			if typ == tar.TypeDir {
				mode = 0o755
			}
		}
		hdr := &tar.Header{
			Typeflag: typ, Name: e.name, Mode: mode, Uid: e.uid, Gid: e.gid, Linkname: e.link,
			ModTime: layerTime.Add(time.Duration(i) * time.Minute), Format: tar.FormatPAX,
		}
		if typ == tar.TypeReg {
			hdr.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// randomText is n bytes of printable noise from seed.
func randomText(seed uint64, n int) string {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = 'a' + byte(r.IntN(26))
	}
	return string(b)
}

// testLayers is an ordinary three-layer image: layer 2 deletes a file and
// makes a dir opaque, layer 3 deletes a file of layer 1 and adds more.
func testLayers(t testing.TB) [][]byte {
	return [][]byte{
		layerTar(t, []entry{
			{name: "bin/", typ: tar.TypeDir},
			{name: "bin/tool", mode: 0o755, body: randomText(1, 5000)},
			{name: "bin/tool-again", typ: tar.TypeLink, link: "bin/tool"},
			{name: "bin/su", mode: 0o4755, body: "setuid"},
			{name: "etc/", typ: tar.TypeDir},
			{name: "etc/passwd", body: "root:x:0:0::/root:/bin/sh\n"},
			{name: "etc/motd", typ: tar.TypeSymlink, link: "../data/old"},
			{name: "data/", typ: tar.TypeDir, mode: 0o750, uid: 7, gid: 8},
			{name: "data/old", body: "old data"},
			{name: "data/sub/", typ: tar.TypeDir},
			{name: "data/sub/deep", body: "deep"},
			{name: "gone.txt", body: "deleted in layer 2"},
			{name: "home/", typ: tar.TypeDir},
			{name: "home/user/", typ: tar.TypeDir, mode: 0o700, uid: 1000, gid: 1000},
			{name: "home/user/notes", mode: 0o600, uid: 1000, gid: 1000, body: "deleted in layer 3"},
			{name: "home/user/keep", mode: 0o640, uid: 1000, gid: 100, body: "kept"},
			{name: "tmp/", typ: tar.TypeDir, mode: 0o1777},
		}),
		layerTar(t, []entry{
			{name: ".wh.gone.txt"},
			{name: "data/", typ: tar.TypeDir, mode: 0o750, uid: 7, gid: 8},
			{name: "data/.wh..wh..opq"},
			{name: "data/new", body: "new data", uid: 7, gid: 8},
			{name: "etc/passwd", body: "root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n"},
		}),
		layerTar(t, []entry{
			{name: "home/user/.wh.notes"},
			{name: "var/log/", typ: tar.TypeDir},
			{name: "var/log/app.log", mode: 0o640, uid: 1000, body: randomText(3, 70000)},
			{name: "var/run", typ: tar.TypeSymlink, link: "/run"},
		}),
	}
}

// bytesProvider serves blobs from memory to containerd's applier.
type bytesProvider map[digest.Digest][]byte

func (p bytesProvider) ReaderAt(_ context.Context, desc ocispec.Descriptor) (content.ReaderAt, error) {
	b, ok := p[desc.Digest]
	if !ok {
		return nil, fmt.Errorf("blob %s: not found", desc.Digest)
	}
	return readerAt{bytes.NewReader(b)}, nil
}

type readerAt struct{ *bytes.Reader }

func (readerAt) Close() error { return nil }

// importLayers unpacks layers as containerd's unpacker does: Prepare with
// the ref label, containerd's own applier on the mounts, Commit. It returns
// the top's name.
func importLayers(t testing.TB, sn snapshots.Snapshotter, layers [][]byte, prefix string) string {
	t.Helper()
	ctx := context.Background()
	blobs := bytesProvider{}
	applier := apply.NewFileSystemApplier(blobs)
	parent := ""
	for i, l := range layers {
		desc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayer, Digest: digest.FromBytes(l), Size: int64(len(l))}
		blobs[desc.Digest] = l
		name := fmt.Sprintf("%s-%d", prefix, i)
		key := "extract-" + name
		ms, err := sn.Prepare(ctx, key, parent, snapshots.WithLabels(map[string]string{snapshots.LabelSnapshotRef: name}))
		if err != nil {
			t.Fatalf("prepare %s: %v", key, err)
		}
		if _, err := applier.Apply(ctx, desc, ms); err != nil {
			t.Fatalf("apply layer %d: %v", i, err)
		}
		if err := sn.Commit(ctx, name, key); err != nil {
			t.Fatalf("commit %s: %v", key, err)
		}
		parent = name
	}
	return parent
}

// expectedTree applies layers one after another into a plain dir, as the
// applier does without overlay (deleting what whiteouts name): the tree a
// container on them must see.
func expectedTree(t testing.TB, layers [][]byte) string {
	t.Helper()
	dir := t.TempDir()
	for i, l := range layers {
		if _, err := archive.Apply(context.Background(), dir, bytes.NewReader(l)); err != nil {
			t.Fatalf("apply layer %d: %v", i, err)
		}
	}
	return dir
}

// node is what a tree comparison looks at for one path.
type node struct {
	mode     fs.FileMode
	uid, gid uint32
	size     int64
	mtime    int64    // regular files and symlinks, ns
	sum      [32]byte // regular files
	link     string   // symlinks
	xattrs   string
	hardlink string // first path (in walk order) of the same inode
}

// readTree describes every path under root (the root itself excluded: its
// attributes belong to the overlay's upper dir).
func readTree(t testing.TB, root string) map[string]node {
	t.Helper()
	tree := map[string]node{}
	inodes := map[uint64]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		n := node{mode: fi.Mode(), uid: st.Uid, gid: st.Gid, xattrs: xattrNames(t, p)}
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			n.size, n.sum, n.mtime = fi.Size(), sha256.Sum256(b), fi.ModTime().UnixNano()
			if first, ok := inodes[st.Ino]; ok {
				n.hardlink = first
			} else {
				inodes[st.Ino] = rel
			}
		case fi.Mode()&fs.ModeSymlink != 0:
			if n.link, err = os.Readlink(p); err != nil {
				return err
			}
			n.mtime = fi.ModTime().UnixNano()
		}
		tree[rel] = n
		return nil
	})
	if err != nil {
		t.Fatalf("read tree %s: %v", root, err)
	}
	return tree
}

// xattrNames lists the xattr names of p, sorted.
func xattrNames(t testing.TB, p string) string {
	t.Helper()
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(p, buf)
	if err != nil {
		t.Fatalf("list xattrs of %s: %v", p, err)
	}
	names := strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00")
	slices.Sort(names)
	return strings.Join(names, ",")
}

// sameTree fails t unless the trees under got and want match.
func sameTree(t testing.TB, what, got, want string) {
	t.Helper()
	g, w := readTree(t, got), readTree(t, want)
	var diffs []string
	for p, wn := range w {
		if gn, ok := g[p]; !ok {
			diffs = append(diffs, fmt.Sprintf("missing %s", p))
		} else if gn != wn {
			diffs = append(diffs, fmt.Sprintf("%s: got %+v, want %+v", p, gn, wn))
		}
	}
	for p := range g {
		if _, ok := w[p]; !ok {
			diffs = append(diffs, fmt.Sprintf("unexpected %s", p))
		}
	}
	slices.Sort(diffs)
	if len(diffs) > 0 {
		t.Errorf("%s differs from the expected tree:\n%s", what, strings.Join(diffs, "\n"))
	}
}

// mountAll mounts ms at a new dir until the test ends.
func mountAll(t testing.TB, ms []mount.Mount) string {
	t.Helper()
	target := t.TempDir()
	if err := mount.All(ms, target); err != nil {
		t.Fatalf("mount %+v: %v", ms, err)
	}
	t.Cleanup(func() {
		if err := mount.UnmountAll(target, 0); err != nil {
			t.Errorf("unmount %s: %v", target, err)
		}
	})
	return target
}

// mountImage mounts the staged rootfs image in dir read-only by loop.
func mountImage(t testing.TB, dir string) string {
	t.Helper()
	r, err := chain.OpenStagedRootfs(dir)
	if err != nil {
		t.Fatal(err)
	}
	return mountAll(t, []mount.Mount{{Type: r.FSType, Source: r.ImagePath(), Options: []string{"ro", "loop"}}})
}

// stagedDir returns the staged dir of a container snapshot on ordinary
// layers, as a shim finds it.
func stagedDir(t testing.TB, ms []mount.Mount) string {
	t.Helper()
	if len(ms) != 1 || ms[0].Type != "overlay" {
		t.Fatalf("mounts = %+v, want one overlay mount", ms)
	}
	dir, err := chain.StagedRootfsDir(ms[0].Options)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// requireOrdinary stops t unless ordinary layers can be served here.
func requireOrdinary(t testing.TB) {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.LookPath(t, mkfsErofs)
}

// writeImageArchive writes an OCI image archive named ref with layers.
func writeImageArchive(t testing.TB, path, ref string, layers [][]byte) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	file := func(name string, b []byte) {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o444, Size: int64(len(b))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	blob := func(mediaType string, b []byte) ocispec.Descriptor {
		d := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(b), Size: int64(len(b))}
		file("blobs/sha256/"+d.Digest.Encoded(), b)
		return d
	}
	jsonOf := func(v any) []byte {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	file(ocispec.ImageLayoutFile, jsonOf(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion}))
	platform := ocispec.Platform{Architecture: "amd64", OS: "linux"}
	img := ocispec.Image{Platform: platform, RootFS: ocispec.RootFS{Type: "layers"}}
	var descs []ocispec.Descriptor
	for _, l := range layers {
		descs = append(descs, blob(ocispec.MediaTypeImageLayer, l))
		img.RootFS.DiffIDs = append(img.RootFS.DiffIDs, digest.FromBytes(l))
	}
	manifest := blob(ocispec.MediaTypeImageManifest, jsonOf(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		Config: blob(ocispec.MediaTypeImageConfig, jsonOf(img)), Layers: descs,
	}))
	manifest.Platform = &platform
	manifest.Annotations = map[string]string{"io.containerd.image.name": ref}
	file(ocispec.ImageIndexFile, jsonOf(ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{manifest},
	}))
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}
