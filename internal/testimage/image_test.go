package testimage

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/images/archive"
	ctrarchive "github.com/containerd/containerd/v2/pkg/archive"
	"github.com/containerd/containerd/v2/pkg/archive/compression"
	"github.com/containerd/containerd/v2/plugins/content/local"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

func busybox(t *testing.T, layers int) *BusyboxImage {
	t.Helper()
	return busyboxLinked(t, layers, false)
}

func busyboxLinked(t *testing.T, layers int, hardLinks bool) *BusyboxImage {
	t.Helper()
	testenv.LookPath(t, DefaultBusybox)
	img, err := Busybox(BusyboxOptions{
		Name: "localhost/testimage/busybox:1", Layers: layers, HardLinks: hardLinks,
		Config: ocispec.ImageConfig{Cmd: []string{"sh"}, User: User, WorkingDir: "/home/app", Env: []string{"A=1"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// imported reads an archive back the way containerd imports it, checking
// every blob's digest, and returns the images it names.
func imported(t *testing.T, data []byte) (content.Store, map[string]ocispec.Descriptor) {
	t.Helper()
	ctx := context.Background()
	cs, err := local.NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	idxDesc, err := archive.ImportIndex(ctx, cs, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	var idx ocispec.Index
	readJSON(t, cs, idxDesc, &idx)
	named := map[string]ocispec.Descriptor{}
	for _, m := range idx.Manifests {
		named[m.Annotations[images.AnnotationImageName]] = m
	}
	return cs, named
}

func readJSON(t *testing.T, cs content.Store, desc ocispec.Descriptor, v any) {
	t.Helper()
	b, err := content.ReadBlob(context.Background(), cs, desc)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
}

func TestWriteArchive(t *testing.T) {
	bb := busybox(t, 3)
	pause, err := Pause(t.Context(), "localhost/testimage/pause:1", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteArchive(t.Context(), &buf, pause, bb.Image); err != nil {
		t.Fatal(err)
	}
	cs, named := imported(t, buf.Bytes())
	for _, img := range []Image{pause, bb.Image} {
		desc, ok := named[img.Name]
		if !ok {
			t.Fatalf("archive names %v, want %s", named, img.Name)
		}
		var m ocispec.Manifest
		readJSON(t, cs, desc, &m)
		var cfg ocispec.Image
		readJSON(t, cs, m.Config, &cfg)
		if cfg.OS != "linux" || cfg.Architecture != "amd64" || len(m.Layers) != len(img.Layers) {
			t.Fatalf("%s: platform %s/%s, %d layers; want linux/amd64, %d", img.Name, cfg.OS, cfg.Architecture, len(m.Layers), len(img.Layers))
		}
		for i, l := range m.Layers {
			if cfg.RootFS.DiffIDs[i] != l.Digest || l.MediaType != ocispec.MediaTypeImageLayer {
				t.Fatalf("%s layer %d: %s %s, diff ID %s; want an uncompressed layer whose diff ID is its digest", img.Name, i, l.MediaType, l.Digest, cfg.RootFS.DiffIDs[i])
			}
		}
		if !slices.Equal(cfg.Config.Entrypoint, img.Config.Entrypoint) || cfg.Config.User != img.Config.User ||
			cfg.Config.WorkingDir != img.Config.WorkingDir || !slices.Equal(cfg.Config.Env, img.Config.Env) {
			t.Fatalf("%s config %+v, want %+v", img.Name, cfg.Config, img.Config)
		}
	}
	if env := bb.Config.Env; !slices.Equal(env, []string{DefaultPath, "A=1"}) {
		t.Fatalf("busybox env %v, want PATH added before the caller's", env)
	}
}

func TestWriteArchiveRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		imgs []Image
		want string
	}{
		{"none", nil, "no images"},
		{"bad name", []Image{{Name: "Not A Ref", Layers: []Layer{{}}}}, "want a reference"},
		{"no layers", []Image{{Name: "localhost/x:1"}}, "no layers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := WriteArchive(t.Context(), &bytes.Buffer{}, tc.imgs...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("WriteArchive = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestBusyboxRejects(t *testing.T) {
	if _, err := Busybox(BusyboxOptions{Name: "localhost/x:1"}); err == nil || !strings.Contains(err.Error(), "at least 1") {
		t.Errorf("Busybox with 0 layers = %v, want an error asking for at least 1", err)
	}
	dynamic := testenv.LookPath(t, "ls")
	if _, err := Busybox(BusyboxOptions{Layers: 1, Binary: dynamic}); err == nil || !strings.Contains(err.Error(), "dynamically linked") {
		t.Errorf("Busybox of %s = %v, want a dynamically-linked error", dynamic, err)
	}
}

// TestBusyboxRootfs unpacks the image's layers as containerd does and runs
// its busybox in it: the whiteout removed its file, the random file and the
// user are there.
func TestBusyboxRootfs(t *testing.T) {
	testenv.RequireRoot(t)
	chroot := testenv.LookPath(t, "chroot")
	for _, tc := range []struct {
		layers    int
		hardLinks bool
	}{{1, false}, {3, false}, {1, true}} {
		layers := tc.layers
		bb := busyboxLinked(t, layers, tc.hardLinks)
		root := t.TempDir()
		for i, l := range bb.Layers {
			data, err := l.Tar()
			if err != nil {
				t.Fatal(err)
			}
			r, err := compression.DecompressStream(bytes.NewReader(data))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ctrarchive.Apply(t.Context(), root, r); err != nil {
				t.Fatalf("apply layer %d: %v", i, err)
			}
		}
		got, err := os.ReadFile(filepath.Join(root, RandomFile))
		if err != nil || string(got) != bb.RandomContent {
			t.Fatalf("%d layers: %s = %q (%v), want %q", layers, RandomFile, got, err, bb.RandomContent)
		}
		if layers > 1 {
			if bb.WhitedOut != WhitedOutFile || !hasEntry(bb.Layers[0], WhitedOutFile) {
				t.Fatalf("%d layers: the lowest layer lacks %s or WhitedOut is %q", layers, WhitedOutFile, bb.WhitedOut)
			}
			if _, err := os.Lstat(filepath.Join(root, WhitedOutFile)); !os.IsNotExist(err) {
				t.Fatalf("%d layers: %s survived the top layer's whiteout (lstat: %v)", layers, WhitedOutFile, err)
			}
		}
		out, err := exec.Command(chroot, root, "/bin/id", User).CombinedOutput()
		want := "uid=1000(app) gid=1000(app) groups=1000(app),1001(extra)"
		if err != nil || strings.TrimSpace(string(out)) != want {
			t.Fatalf("%d layers: id %s = %q (%v), want %q", layers, User, out, err, want)
		}
	}
}

func hasEntry(l Layer, p string) bool {
	return slices.ContainsFunc(l, func(e Entry) bool { return "/"+strings.TrimPrefix(e.Path, "/") == p })
}
