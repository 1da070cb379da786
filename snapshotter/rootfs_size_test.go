package snapshotter

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// TestRootfsSizeBound: holes count — a sparse file costs nothing on disk
// but its full size in an erofs image.
func TestRootfsSizeBound(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	sparse := filepath.Join(dir, "data", "sparse")
	if err := os.WriteFile(sparse, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(sparse, 1<<40); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		max  int64
		fail bool
	}{{0, false}, {1 << 41, false}, {1 << 30, true}} {
		err := imageBuilder{maxSize: tc.max}.checkTree(dir)
		if (err != nil) != tc.fail {
			t.Fatalf("checkTree with max %d: %v, want failure %v", tc.max, err, tc.fail)
		}
		if tc.fail && (!errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "/data/sparse")) {
			t.Fatalf("checkTree error %v, want an invalid argument naming the file", err)
		}
	}
}
