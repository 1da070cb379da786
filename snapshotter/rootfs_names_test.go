package snapshotter

import (
	"archive/tar"
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// TestOrdinaryLongNames: a container's rootfs whose file names mkfs.erofs
// builds comes out whole; one with a longer name is refused, naming the
// file and the limit, where mkfs.erofs failed naming nothing or, beside
// the name cut short, built an image with the longer file's content lost.
func TestOrdinaryLongNames(t *testing.T) {
	requireOrdinary(t)
	name := func(n int) string { return "d/" + strings.Repeat("n", n) }
	tests := []struct {
		name    string
		entries []entry
		err     string
	}{
		{"longest", []entry{{name: "d/", typ: tar.TypeDir}, {name: name(maxNameLen), body: "fits"}}, ""},
		{"too long", []entry{{name: "d/", typ: tar.TypeDir}, {name: name(maxNameLen + 1), body: "long"}},
			"a file name of 255 bytes (at /" + name(maxNameLen+1) + "): mkfs.erofs builds names of up to " + strconv.Itoa(maxNameLen) + " bytes"},
		{"too long beside its cut", []entry{{name: "d/", typ: tar.TypeDir}, {name: name(maxNameLen), body: "short"}, {name: name(maxNameLen + 1), body: "long"}},
			"a file name of 255 bytes"},
		{"too long dir", []entry{{name: name(maxNameLen+1) + "/", typ: tar.TypeDir}},
			"a file name of 255 bytes (at /" + name(maxNameLen+1) + ")"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			layers := [][]byte{layerTar(t, tc.entries)}
			sn, _ := serveNew(t)
			top := importLayers(t, sn, layers, "layer")
			ms, err := sn.Prepare(context.Background(), "ctr", top)
			if tc.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				sameTree(t, "the staged image", mountImage(t, stagedDir(t, ms)), expectedTree(t, layers))
				return
			}
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("Prepare: %v; want an invalid argument containing %q", err, tc.err)
			}
		})
	}
}
