package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/ctrdtest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testimage"
)

// largeRef is a base snapshot of more guest memory than imageRef's.
const (
	largeRef    = "example.com/cocoon/e2e:large"
	largeMemory = 384 << 20
)

// TestOrdinaryImageBaseImages: with restore.base_images, a container's own
// VM restores the largest base its memory limit holds (the guest's
// MemTotal tells which), and a limit that holds none fails the create
// naming each base's size, leaving no base snapshot or lease behind
// though both were staged to learn their sizes.
func TestOrdinaryImageBaseImages(t *testing.T) {
	archive, err := testimage.Bake(testenv.Bin(t, "cocoonctl"), testenv.Guest(t), largeRef, largeMemory, t.TempDir(), testimage.BakeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := stack(t, fmt.Sprintf("[restore]\nbase_images = [%q, %q]\n", imageRef, largeRef))
	importBusybox(t, c)
	if _, err := c.Ctr("images", "import", "--snapshotter", ctrdtest.Snapshotter, archive); err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		name  string
		limit int64
		large bool // want the large base
	}{
		{"both fit: the larger", 512 << 20, true},
		{"only the smaller fits", 300 << 20, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := runOrdinary(c, []string{"--rm", "--memory-limit", strconv.FormatInt(tc.limit, 10)}, fmt.Sprintf("b%d", i),
				"sh", "-c", "grep MemTotal /proc/meminfo")
			if err != nil {
				t.Fatalf("run: %v\n%s", err, out)
			}
			f := strings.Fields(out)
			kb, err := strconv.ParseInt(f[len(f)-2], 10, 64)
			if err != nil {
				t.Fatalf("MemTotal %q: %v", out, err)
			}
			if large := kb<<10 > 320<<20; large != tc.large {
				t.Fatalf("guest MemTotal %d KiB under a limit of %d MiB: restored the large base %v, want %v", kb, tc.limit>>20, large, tc.large)
			}
		})
	}
	_, err = runOrdinary(c, []string{"--rm", "--memory-limit", strconv.Itoa(200 << 20)}, "none", "true")
	if err == nil || !strings.Contains(err.Error(), "none of restore.base_images has at most the container's memory limit 200MiB") ||
		!strings.Contains(err.Error(), largeRef+" (384MiB)") {
		t.Fatalf("run under a limit no base fits: %v, want an error naming the limit and each base's size", err)
	}
	if out, _ := c.Ctr("snapshots", "--snapshotter", ctrdtest.Snapshotter, "ls"); strings.Contains(out, "cocoon-base-") {
		t.Fatalf("a base snapshot was left behind:\n%s", out)
	}
	if out, _ := c.Ctr("leases", "ls"); strings.Contains(out, "cocoon-base-") {
		t.Fatalf("a base lease was left behind:\n%s", out)
	}
}
