package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/ctrdtest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testimage"
)

const ordinaryRef = "example.com/cocoon/busybox:1"

// ordinaryStack is a stack whose runtime config restores the test's chain
// image as the base snapshot of ordinary images, with a busybox image (two
// layers, a whiteout, a non-root user) imported into the cocoon
// snapshotter.
func ordinaryStack(t testing.TB, baseImage string, extraConfig ...string) (*ctrdtest.Containerd, *testimage.BusyboxImage) {
	t.Helper()
	c := stack(t, fmt.Sprintf("[restore]\nbase_image = %q\n%s", baseImage, strings.Join(extraConfig, "\n")))
	return c, importBusybox(t, c)
}

// importBusybox imports the test's busybox image into the cocoon
// snapshotter.
func importBusybox(t testing.TB, c *ctrdtest.Containerd) *testimage.BusyboxImage {
	t.Helper()
	img, err := testimage.Busybox(testimage.BusyboxOptions{Name: ordinaryRef, Layers: 2})
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "busybox.tar")
	if err := testimage.WriteArchiveFile(context.Background(), archive, img.Image); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Ctr("images", "import", "--snapshotter", ctrdtest.Snapshotter, archive); err != nil {
		t.Fatal(err)
	}
	return img
}

// TestOrdinaryImageUnpacksBase: a base image whose layers are not unpacked
// in the snapshotter (imported elsewhere, or its snapshots removed) is
// unpacked at its first use, and the container runs.
func TestOrdinaryImageUnpacksBase(t *testing.T) {
	c := stack(t, fmt.Sprintf("[restore]\nbase_image = %q\n", imageRef))
	for round := 0; len(snapshotKeys(t, c)) > 0; round++ {
		if round == 10 {
			t.Fatalf("the base image's snapshots %v stay", snapshotKeys(t, c))
		}
		for _, k := range snapshotKeys(t, c) {
			// A parent goes once its children have; a later round takes it.
			_, _ = c.Ctr("snapshots", "--snapshotter", ctrdtest.Snapshotter, "rm", k)
		}
	}
	img := importBusybox(t, c)
	busybox := len(snapshotKeys(t, c))
	out, err := runOrdinary(c, []string{"--rm"}, "u1", "cat", testimage.RandomFile)
	if err != nil || strings.TrimSpace(out) != strings.TrimSpace(img.RandomContent) {
		t.Fatalf("container on a base image not unpacked: %q, %v", out, err)
	}
	if n := len(snapshotKeys(t, c)); n <= busybox {
		t.Fatalf("%d snapshots after the run, %d before: the base image was not unpacked", n, busybox)
	}
}

// snapshotKeys lists the cocoon snapshotter's snapshots.
func snapshotKeys(t *testing.T, c *ctrdtest.Containerd) []string {
	t.Helper()
	out, err := c.Ctr("snapshots", "--snapshotter", ctrdtest.Snapshotter, "ls")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, line := range strings.Split(out, "\n")[1:] { // a header, then KEY PARENT KIND
		if f := strings.Fields(line); len(f) > 0 {
			keys = append(keys, f[0])
		}
	}
	return keys
}

// runOrdinary is `ctr run` of the busybox image with the cocoon runtime.
func runOrdinary(c *ctrdtest.Containerd, flags []string, id string, args ...string) (string, error) {
	argv := append([]string{"run", "--runtime", runtimeName, "--snapshotter", ctrdtest.Snapshotter, "--fifo-dir", c.FifoDir}, flags...)
	argv = append(argv, ordinaryRef, id)
	return c.Ctr(append(argv, args...)...)
}

// TestOrdinaryImage: an ordinary OCI image runs in a VM restored from the
// base snapshot, its layers the VM's root: its files, the guest's kernel,
// its user, and a private writable layer.
func TestOrdinaryImage(t *testing.T) {
	c, img := ordinaryStack(t, imageRef)
	for i, tc := range []struct {
		name  string
		flags []string
		args  []string
		want  string
	}{
		{"the image's file", nil, []string{"cat", testimage.RandomFile}, strings.TrimSpace(img.RandomContent)},
		{"the guest's kernel", nil, []string{"uname", "-r"}, guestKernel(t)},
		{"the image's user", []string{"--user", testimage.User}, []string{"id"},
			fmt.Sprintf("uid=%d(%s) gid=%d(%s) groups=%d(%s),%d(%s)", testimage.UID, testimage.User, testimage.UID, testimage.User,
				testimage.UID, testimage.User, testimage.ExtraGID, testimage.ExtraGroup)},
		{"a whiteout in the top layer", nil, []string{"sh", "-c", "test -e " + testimage.WhitedOutFile + " && echo present || echo absent"}, "absent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := runOrdinary(c, append([]string{"--rm"}, tc.flags...), fmt.Sprintf("o%d", i), tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.TrimSpace(out); got != tc.want {
				t.Fatalf("%v printed %q, want %q", tc.args, got, tc.want)
			}
		})
	}
}

// TestOrdinaryImageWritesArePrivate: two containers of one image write the
// same path at the same time; neither sees the other's file.
func TestOrdinaryImageWritesArePrivate(t *testing.T) {
	c, _ := ordinaryStack(t, imageRef)
	script := `echo %s > /data/mine && sleep 2 && cat /data/mine && ls /data`
	var wg sync.WaitGroup
	outs := make([]string, 2)
	errs := make([]error, 2)
	for i := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], errs[i] = runOrdinary(c, []string{"--rm"}, fmt.Sprintf("w%d", i), "sh", "-c", fmt.Sprintf(script, fmt.Sprint("writer-", i)))
		}()
	}
	wg.Wait()
	for i := range outs {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if want := fmt.Sprintf("writer-%d\nmine\nrandom.txt", i); strings.TrimSpace(outs[i]) != want {
			t.Fatalf("container %d printed %q, want %q", i, outs[i], want)
		}
	}
}

// TestOrdinaryImageShared: eight containers of one image at once stage one
// filesystem image (one inode, linked once per container), unlinked again
// once they are gone.
func TestOrdinaryImageShared(t *testing.T) {
	c, _ := ordinaryStack(t, imageRef)
	const n = 8
	for i := range n {
		if _, err := runOrdinary(c, []string{"-d"}, fmt.Sprintf("s%d", i), "sleep", "600"); err != nil {
			t.Fatal(err)
		}
	}
	img := rootfsImage(t, c)
	if got := nlink(t, img); got != n+1 {
		t.Fatalf("filesystem image %s has %d links with %d containers running, want %d", img, got, n, n+1)
	}
	for i := range n {
		id := fmt.Sprintf("s%d", i)
		if _, err := c.Ctr("task", "kill", "-s", "SIGKILL", id); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Ctr("task", "delete", "-f", id); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Ctr("containers", "delete", id); err != nil {
			t.Fatal(err)
		}
	}
	// containerd removes deleted snapshots from the snapshotter when it
	// collects garbage.
	c.CollectGarbage()
	if got := nlink(t, img); got != 1 {
		t.Fatalf("filesystem image %s has %d links after every container was deleted, want 1", img, got)
	}
}

// TestOrdinaryImageBadBase: a missing base image, and a base image that is
// itself an ordinary image, fail the create with a clear error and leave
// no task, VM or base snapshot behind.
func TestOrdinaryImageBadBase(t *testing.T) {
	for _, tc := range []struct {
		name, base, want string
	}{
		{"missing", "example.com/cocoon/none:1", "example.com/cocoon/none:1"},
		{"not a chain", ordinaryRef, "not a cocoon snapshot image"},
		{"unset", "", "set restore.base_image"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := ordinaryStack(t, tc.base)
			_, err := runOrdinary(c, []string{"--rm"}, "bad", "true")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("run with base image %q: %v, want an error containing %q", tc.base, err, tc.want)
			}
			if out, _ := c.Ctr("snapshots", "--snapshotter", ctrdtest.Snapshotter, "ls"); strings.Contains(out, "cocoon-base-") {
				t.Fatalf("a base snapshot was left behind:\n%s", out)
			}
			if out, _ := c.Ctr("leases", "ls"); strings.Contains(out, "cocoon-base-") {
				t.Fatalf("a base lease was left behind:\n%s", out)
			}
			if pids := c.InUse(); len(pids) > 0 {
				t.Fatalf("processes still use the stack: %v", pids)
			}
		})
	}
}

// TestOrdinaryImageNotConverted: an image whose layers cannot become a
// root filesystem image (here: larger than snapshotter.max_rootfs_size, as
// a layer's sparse file of any size would be) fails the run with an error
// naming why, and leaves no container, snapshot or half-built image.
func TestOrdinaryImageNotConverted(t *testing.T) {
	c, _ := ordinaryStack(t, imageRef, "[snapshotter]\nmax_rootfs_size = \"256KiB\"\n")
	_, err := runOrdinary(c, []string{"--rm"}, "big", "true")
	if err == nil || !strings.Contains(err.Error(), "max_rootfs_size") {
		t.Fatalf("run of an image over max_rootfs_size: %v, want an error naming it", err)
	}
	if out, _ := c.Ctr("containers", "ls", "-q"); strings.TrimSpace(out) != "" {
		t.Fatalf("containers left: %q", out)
	}
	c.CollectGarbage()
	if out, _ := c.Ctr("snapshots", "--snapshotter", ctrdtest.Snapshotter, "ls"); strings.Contains(out, "Active") {
		t.Fatalf("an active snapshot was left:\n%s", out)
	}
	if left, _ := filepath.Glob(filepath.Join(c.SnapshotterRoot, "flat", "*")); len(left) > 0 {
		t.Fatalf("the flat cache holds %v after a failed conversion", left)
	}
}

// guestKernel is the guest build's kernel release.
func guestKernel(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testenv.Guest(t), "BUILDINFO"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "kernel.release="); ok {
			return v
		}
	}
	t.Fatal("BUILDINFO has no kernel.release")
	return ""
}

// rootfsImage is the one filesystem image in the snapshotter's flat cache.
func rootfsImage(t *testing.T, c *ctrdtest.Containerd) string {
	t.Helper()
	imgs, err := filepath.Glob(filepath.Join(c.SnapshotterRoot, "flat", "erofs-*"))
	if err != nil || len(imgs) != 1 {
		t.Fatalf("filesystem images in the flat cache: %v (%v), want one", imgs, err)
	}
	return imgs[0]
}

func nlink(t *testing.T, path string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Nlink
}
