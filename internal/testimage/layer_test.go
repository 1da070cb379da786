package testimage

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"testing"
)

// tarEntries lists a tar's entries as "name type mode uid:gid [target]".
func tarEntries(t *testing.T, data []byte) []string {
	t.Helper()
	var out []string
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		line := fmt.Sprintf("%s %c %o %d:%d", hdr.Name, hdr.Typeflag, hdr.Mode, hdr.Uid, hdr.Gid)
		if hdr.Linkname != "" {
			line += " " + hdr.Linkname
		}
		out = append(out, line)
	}
}

func TestLayerTar(t *testing.T) {
	for _, tc := range []struct {
		name  string
		layer Layer
		want  []string
	}{{
		name:  "parents added and sorted",
		layer: Layer{File("/usr/bin/x", 0o755, []byte("x")), Symlink("bin", "usr/bin")},
		want:  []string{"bin 2 777 0:0 usr/bin", "usr/ 5 755 0:0", "usr/bin/ 5 755 0:0", "usr/bin/x 0 755 0:0"},
	}, {
		name:  "explicit dir kept, special bits, owner",
		layer: Layer{Dir("tmp", 0o777|fs.ModeSticky), Dir("home/app", 0o700).Owned(1000, 1000)},
		want:  []string{"home/ 5 755 0:0", "home/app/ 5 700 1000:1000", "tmp/ 5 1777 0:0"},
	}, {
		name:  "hard links after their targets",
		layer: Layer{Hardlink("bin/[", "/bin/busybox"), File("bin/busybox", 0o755, []byte("b"))},
		want:  []string{"bin/ 5 755 0:0", "bin/busybox 0 755 0:0", "bin/[ 1 755 0:0 bin/busybox"},
	}, {
		name:  "whiteout",
		layer: Layer{Whiteout("/etc/gone")},
		want:  []string{"etc/ 5 755 0:0", "etc/.wh.gone 0 0 0:0"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			data, err := tc.layer.Tar()
			if err != nil {
				t.Fatal(err)
			}
			if got := tarEntries(t, data); strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Fatalf("entries:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
			again, _ := tc.layer.Tar()
			if !bytes.Equal(data, again) {
				t.Fatal("the same layer tars to different bytes")
			}
		})
	}
}

func TestLayerTarRejects(t *testing.T) {
	for _, tc := range []struct {
		name  string
		layer Layer
		want  string
	}{
		{"duplicate", Layer{File("a", 0o644, nil), File("/a", 0o644, nil)}, "given twice"},
		{"escape", Layer{File("../a", 0o644, nil)}, "inside the image"},
		{"root", Layer{Dir("/", 0o755)}, "inside the image"},
		{"link to nothing", Layer{Hardlink("a", "b")}, "want a regular file of the layer"},
		{"link to a dir", Layer{Hardlink("a", "b"), Dir("b", 0o755)}, "want a regular file of the layer"},
		{"device", Layer{{Path: "dev/null", Mode: fs.ModeDevice | 0o666}}, "want a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := tc.layer.Tar(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Tar() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
