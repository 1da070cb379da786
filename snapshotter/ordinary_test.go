package snapshotter

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// TestOrdinaryLayers unpacks an ordinary image with whiteouts through the
// gRPC service with containerd's applier and checks every mount a client
// gets, and the staged image, against the layers applied to a plain dir.
func TestOrdinaryLayers(t *testing.T) {
	requireOrdinary(t)
	ctx := context.Background()
	layers := testLayers(t)
	want := expectedTree(t, layers)
	sn, local := serveNew(t)
	top := importLayers(t, sn, layers, "layer")

	for i := range layers {
		info, err := sn.Stat(ctx, fmt.Sprintf("layer-%d", i))
		if err != nil || info.Labels[labelKind] != kindOrdinary {
			t.Errorf("layer %d: labels %v, %v; want %s=%s", i, info.Labels, err, labelKind, kindOrdinary)
		}
	}

	ms, err := sn.Prepare(ctx, "ctr", top)
	if err != nil {
		t.Fatal(err)
	}
	dir := stagedDir(t, ms)
	rootfs := mountAll(t, ms)
	sameTree(t, "the container's mount", rootfs, want)
	sameTree(t, "the staged image", mountImage(t, dir), want)

	r, err := chain.OpenStagedRootfs(dir)
	if err != nil {
		t.Fatal(err)
	}
	if r.Layers != 3 || r.Key != imageName(t, local, top) {
		t.Errorf("descriptor %+v: want 3 layers keyed by the top layer", r)
	}
	img := filepath.Join(local.root, "flat", r.Key)
	fi, err := os.Stat(img)
	if err != nil {
		t.Fatal(err)
	}
	if st := stat(t, img); fi.Mode().Perm() != 0o444 || st.Nlink != 2 || st.Ino != stat(t, r.ImagePath()).Ino {
		t.Errorf("image mode %v nlink %d: want 0444 with nlink 2 (the cache and one container), staged by hard link", fi.Mode(), st.Nlink)
	}

	// The container writes into its own upper dir only.
	if err := os.WriteFile(filepath.Join(rootfs, "etc", "written"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, upperDirName, "etc", "written")); err != nil || string(b) != "mine" {
		t.Errorf("a container write is not in its upper dir: %q, %v", b, err)
	}
	other, err := sn.Prepare(ctx, "other", top)
	if err != nil {
		t.Fatal(err)
	}
	sameTree(t, "a second container's mount", mountAll(t, other), want)
	sameTree(t, "the staged image after a container write", mountImage(t, stagedDir(t, other)), want)

	t.Run("usage", func(t *testing.T) {
		for _, key := range []string{"layer-0", top, "ctr"} {
			u, err := sn.Usage(ctx, key)
			if err != nil || u.Size <= 0 || u.Inodes <= 0 {
				t.Errorf("Usage(%s) = %+v, %v; want its files counted", key, u, err)
			}
		}
		// The image alone is over 64 KiB (app.log is 70000 bytes).
		if u, err := sn.Usage(ctx, "ctr"); err != nil || u.Size > 64<<10 {
			t.Errorf("Usage(ctr) = %+v, %v; want its upper dir only (one small file), not the layers or the image", u, err)
		}
	})
	t.Run("views", func(t *testing.T) {
		for _, tc := range []struct {
			parent, typ string
			layers      int
		}{{"layer-0", "bind", 1}, {top, "overlay", 3}} {
			ms, err := sn.View(ctx, "view-"+tc.parent, tc.parent)
			if err != nil {
				t.Fatal(err)
			}
			if len(ms) != 1 || ms[0].Type != tc.typ || !hasOption(ms[0].Options, "ro") && tc.typ == "bind" {
				t.Errorf("view of %d layers: %+v, want one read-only %s mount", tc.layers, ms, tc.typ)
			}
			if tc.layers == len(layers) {
				sameTree(t, "a view", mountAll(t, ms), want)
			}
		}
	})
}

// serveNew serves a new snapshotter over gRPC and returns the client and,
// for looking inside, the snapshotter.
func serveNew(t *testing.T, opts ...Opt) (snapshots.Snapshotter, *Snapshotter) {
	t.Helper()
	local := newSnapshotter(t, t.TempDir(), opts...)
	return serve(t, local), local
}

func hasOption(opts []string, o string) bool {
	for _, x := range opts {
		if x == o {
			return true
		}
	}
	return false
}

// countBuilds returns an Opt that counts image builds in n.
func countBuilds(t testing.TB, root string, n *atomic.Int64) Opt {
	b := imageBuilder{mntDir: filepath.Join(root, "mnt"), layerDir: filepath.Join(root, "snapshots"), options: overlayOptions(root)}
	return withBuildImage(func(ctx context.Context, layers []string, out string) error {
		n.Add(1)
		return b.build(ctx, layers, out)
	})
}

func TestConcurrentOrdinaryPreparesBuildOnce(t *testing.T) {
	const clones = 8
	requireOrdinary(t)
	ctx := context.Background()
	root := t.TempDir()
	var builds atomic.Int64
	// A one-byte budget: every unpinned file is over it.
	local := newSnapshotter(t, root, countBuilds(t, root, &builds), WithFlatCacheSize(1))
	sn := serve(t, local)
	top := importLayers(t, sn, testLayers(t), "layer")

	var dirs []string
	for _, ms := range prepareAll(t, sn, top, clones) {
		dirs = append(dirs, stagedDir(t, ms))
	}
	if n := builds.Load(); n != 1 {
		t.Fatalf("%d concurrent prepares built %d images, want 1", clones, n)
	}
	img := filepath.Join(root, "flat", imageName(t, local, top))
	want := stat(t, img)
	if want.Nlink != clones+1 {
		t.Errorf("image nlink = %d, want %d", want.Nlink, clones+1)
	}
	for _, d := range dirs {
		if st := stat(t, filepath.Join(d, chain.StagedRootfsImage)); st.Ino != want.Ino || st.Dev != want.Dev {
			t.Errorf("%s stages inode %d, want the cached image's %d", d, st.Ino, want.Ino)
		}
	}
	local.flat.evictNow()
	if _, err := os.Stat(img); err != nil {
		t.Fatalf("a pinned image was evicted: %v", err)
	}

	for i := range clones {
		if err := sn.Remove(ctx, fmt.Sprintf("ctr-%d", i)); err != nil {
			t.Fatal(err)
		}
		if i == clones-2 {
			if n := stat(t, img).Nlink; n != 2 {
				t.Errorf("with one container left nlink = %d, want 2", n)
			}
		}
	}
	local.flat.evictNow()
	if _, err := os.Stat(img); !os.IsNotExist(err) {
		t.Errorf("an unpinned image over budget survived eviction (err %v)", err)
	}
}

// TestCommitDecidesKind commits layers of every kind through gRPC and
// checks the kind recorded and the mounts a container on each gets.
func TestCommitDecidesKind(t *testing.T) {
	requireOrdinary(t)
	ctx := context.Background()
	fx := makeChain(t, t.TempDir(), 52, 32, 1)
	sn, local := serveNew(t)
	link := importChain(t, sn, fx, "link")
	ordinary := importLayers(t, sn, testLayers(t)[:1], "plain")

	tests := []struct {
		name, parent string
		files        func(t *testing.T, dir string)
		want         string
	}{
		{"a link", "", func(t *testing.T, dir string) { copyDir(t, fx.dirs[0], dir) }, kindLink},
		{"link.json only", "", func(t *testing.T, dir string) {
			copyFile(t, filepath.Join(fx.dirs[0], chain.LinkFile), filepath.Join(dir, chain.LinkFile))
		}, kindOrdinary},
		{"link files but link.json", "", func(t *testing.T, dir string) {
			copyDir(t, fx.dirs[0], dir)
			os.Remove(filepath.Join(dir, chain.LinkFile))
		}, kindOrdinary},
		{"plain files", "", func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, "hello"), []byte("hi"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, kindOrdinary},
		{"a link on an ordinary layer", ordinary, func(t *testing.T, dir string) { copyDir(t, fx.dirs[0], dir) }, kindOrdinary},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			name, key := fmt.Sprint("kind-", i), fmt.Sprint("extract-kind-", i)
			ms, err := sn.Prepare(ctx, key, tc.parent, snapshots.WithLabels(map[string]string{snapshots.LabelSnapshotRef: name}))
			if err != nil {
				t.Fatal(err)
			}
			dir := ms[0].Source
			if tc.parent != "" {
				dir, err = upperOf(ms)
				if err != nil {
					t.Fatal(err)
				}
			}
			tc.files(t, dir)
			if err := sn.Commit(ctx, name, key); err != nil {
				t.Fatalf("commit: %v", err)
			}
			info, err := sn.Stat(ctx, name)
			if err != nil || info.Labels[labelKind] != tc.want {
				t.Fatalf("committed labels %v, %v; want %s=%s", info.Labels, err, labelKind, tc.want)
			}
			ctr, err := sn.Prepare(ctx, "ctr-"+name, name)
			if err != nil {
				t.Fatal(err)
			}
			if got := ctr[0].Type; (got == "bind") != (tc.want == kindLink) {
				t.Errorf("a container on a %s gets a %s mount", tc.want, got)
			}
		})
	}
	if _, err := sn.Prepare(ctx, "ctr-link", link); err != nil {
		t.Fatal(err)
	}
	// "a link" is fx's link again: one flat memory for both.
	if n := len(flatFiles(t, local.root)); n != 1+4 {
		t.Errorf("flat files %v, want 1 flat memory and 4 images", flatFiles(t, local.root))
	}
}

// upperOf returns the upperdir of an overlay mount.
func upperOf(ms []mount.Mount) (string, error) {
	for _, o := range ms[0].Options {
		if upper, ok := strings.CutPrefix(o, "upperdir="); ok {
			return upper, nil
		}
	}
	return "", fmt.Errorf("mounts %+v have no upperdir", ms)
}

func copyFile(t testing.TB, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// imageName is the flat cache name of the rootfs image of the ordinary
// layers topped by the committed snapshot name.
func imageName(t *testing.T, sn *Snapshotter, name string) string {
	t.Helper()
	info, err := sn.Stat(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return rootfsCacheName(snapshotID(t, sn, name), info.Created)
}
