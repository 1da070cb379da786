package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// TestCrashMidImageBuild kills the daemon while mkfs builds an image (a
// stand-in mkfs that writes part of its output and hangs): no mount and no
// mkfs outlive it, and a restart removes the half-built image and the
// mount point and builds the image again.
func TestCrashMidImageBuild(t *testing.T) {
	requireOrdinary(t)
	ctx := context.Background()
	root := t.TempDir()
	address := filepath.Join(t.TempDir(), "sn.sock")
	bin := t.TempDir()
	pidFile := filepath.Join(bin, "mkfs.pid")
	script := "#!/bin/sh\necho $$ > " + pidFile + "\necho partial > \"$2\"\nexec sleep 600\n"
	if err := os.WriteFile(filepath.Join(bin, mkfsErofs), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}

	d := startDaemon(t, root, address, "PATH="+bin+":"+os.Getenv("PATH"))
	sn := dial(t, address)
	top := importLayers(t, sn, testLayers(t), "layer")
	go sn.Prepare(ctx, "ctr", top) //nolint:errcheck // fails when the daemon dies
	pid := waitForPid(t, pidFile)
	if leftovers(t, root, "mnt") == 0 {
		t.Fatal("no build mount point while mkfs runs")
	}
	if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-d.done

	t.Cleanup(func() { unix.Kill(pid, syscall.SIGKILL) })
	testenv.Eventually(t, 10*time.Second, fmt.Sprintf("mkfs (pid %d) gone with the snapshotter", pid), func() error {
		if unix.Kill(pid, 0) == nil {
			return errors.New("it still runs")
		}
		return nil
	})
	if ms := mountsUnder(t, root); len(ms) > 0 {
		t.Errorf("the killed snapshotter left mounts %v", ms)
	}
	var temps int
	for _, name := range flatFiles(t, root) {
		if !chain.IsTemp(name) {
			t.Fatalf("a killed build left a visible file %s", name)
		}
		temps++
	}
	if temps != 1 {
		t.Errorf("%d temp files after the kill, want the half-built image", temps)
	}
	os.Remove(address)

	d = startDaemon(t, root, address)
	if files := flatFiles(t, root); len(files) != 0 {
		t.Errorf("restart left %v in the flat cache, want the temp file removed", files)
	}
	if n := leftovers(t, root, "mnt"); n != 0 {
		t.Errorf("restart left %d build mount points", n)
	}
	sn = dial(t, address)
	ms, err := sn.Prepare(ctx, "ctr", top)
	if err != nil {
		t.Fatalf("prepare after restart: %v", err)
	}
	sameTree(t, "the image built after a restart", mountImage(t, stagedDir(t, ms)), expectedTree(t, testLayers(t)))
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := <-d.done; err != nil {
		t.Errorf("daemon exit after SIGTERM: %v", err)
	}
}

// TestRestartCleansAndKeepsKinds restarts over a half-built image and a
// build mount left mounted on the host: both go, and the ordinary layers,
// their container and its image stay what they were.
func TestRestartCleansAndKeepsKinds(t *testing.T) {
	requireOrdinary(t)
	ctx := context.Background()
	root := t.TempDir()
	sn, err := New(context.Background(), root)
	if err != nil {
		t.Fatal(err)
	}
	removableAfter(t, root)
	top := importLayers(t, sn, testLayers(t), "layer")
	ms, err := sn.Prepare(ctx, "ctr", top)
	if err != nil {
		t.Fatal(err)
	}
	dir := stagedDir(t, ms)
	img := filepath.Join(root, "flat", imageName(t, sn, top))
	sn.Close()

	half := filepath.Join(root, "flat", ".tmp-erofs-99-123")
	if err := os.WriteFile(half, []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}
	mp := filepath.Join(root, "mnt", "build-123")
	if err := os.Mkdir(mp, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mp, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mount.UnmountAll(mp, unix.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(mp, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}

	sn = newSnapshotter(t, root)
	for _, p := range []string{half, mp} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s survived a restart (err %v)", p, err)
		}
	}
	if ms := mountsUnder(t, root); len(ms) > 0 {
		t.Errorf("mounts %v survived a restart", ms)
	}
	again, err := sn.Mounts(ctx, "ctr")
	if err != nil || stagedDir(t, again) != dir {
		t.Errorf("container mounts after a restart: %+v, %v; want the overlay on %s", again, err, dir)
	}
	sn.flat.evictNow()
	if n := stat(t, img).Nlink; n != 2 {
		t.Errorf("image nlink %d after a restart, want 2", n)
	}
	if err := sn.Remove(ctx, "ctr"); err != nil {
		t.Fatal(err)
	}
	sn.flat.evictNow()
	if _, err := os.Stat(img); err != nil {
		t.Errorf("the image of a live layer chain was evicted without a budget: %v", err)
	}
	if err := sn.Remove(ctx, top); err != nil {
		t.Fatal(err)
	}
	sn.flat.evictNow()
	if _, err := os.Stat(img); !os.IsNotExist(err) {
		t.Errorf("the image outlived its top layer (err %v)", err)
	}
}

// TestRestageOrdinaryAfterReboot loses the staged image and descriptor (not
// fsynced) and boots again: they are staged again, the container's own
// writes in its upper dir stay.
func TestRestageOrdinaryAfterReboot(t *testing.T) {
	requireOrdinary(t)
	ctx := context.Background()
	root := t.TempDir()
	boot := "boot-1"
	sn, err := New(context.Background(), root, withBootID(func() (string, error) { return boot, nil }))
	if err != nil {
		t.Fatal(err)
	}
	removableAfter(t, root)
	top := importLayers(t, sn, testLayers(t), "layer")
	ms, err := sn.Prepare(ctx, "ctr", top)
	if err != nil {
		t.Fatal(err)
	}
	dir := stagedDir(t, ms)
	written := filepath.Join(dir, upperDirName, "written")
	if err := os.WriteFile(written, []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	sn.Close()
	if err := os.Remove(filepath.Join(dir, chain.StagedRootfsImage)); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(dir, chain.StagedRootfsFile), 0); err != nil {
		t.Fatal(err)
	}

	boot = "boot-2"
	sn = newSnapshotter(t, root, withBootID(func() (string, error) { return boot, nil }))
	r, err := chain.OpenStagedRootfs(dir)
	if err != nil {
		t.Fatalf("staged rootfs after a reboot: %v", err)
	}
	if st := stat(t, r.ImagePath()); st.Ino != stat(t, filepath.Join(root, "flat", r.Key)).Ino {
		t.Errorf("re-staged image is inode %d, not the cached image", st.Ino)
	}
	if b, err := os.ReadFile(written); err != nil || string(b) != "mine" {
		t.Errorf("the container's write after re-staging: %q, %v", b, err)
	}
	if _, err := sn.Prepare(ctx, "ctr-2", top); err != nil {
		t.Errorf("prepare after re-staging: %v", err)
	}
}

// TestUpdateKeepsKind: a client replacing a layer's labels, as containerd
// does, cannot drop or change the kind the snapshotter recorded.
func TestUpdateKeepsKind(t *testing.T) {
	requireOrdinary(t)
	ctx := context.Background()
	sn, _ := serveNew(t)
	top := importLayers(t, sn, testLayers(t)[:1], "layer")
	for _, tc := range []struct {
		name   string
		labels map[string]string
		paths  []string
	}{
		{"replace all", map[string]string{"x": "1"}, []string{"labels"}},
		{"set the kind", map[string]string{labelKind: kindLink}, []string{"labels." + labelKind}},
		{"no field paths", map[string]string{"y": "2"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := sn.Update(ctx, snapshots.Info{Name: top, Labels: tc.labels}, tc.paths...)
			if err != nil {
				t.Fatal(err)
			}
			info, err := sn.Stat(ctx, top)
			if err != nil || info.Labels[labelKind] != kindOrdinary || got.Labels[labelKind] != kindOrdinary {
				t.Errorf("after Update labels are %v (returned %v), %v; want %s kept", info.Labels, got.Labels, err, labelKind)
			}
			for k, v := range tc.labels {
				if k != labelKind && info.Labels[k] != v {
					t.Errorf("label %s = %q, want %q", k, info.Labels[k], v)
				}
			}
		})
	}
	ms, err := sn.Prepare(ctx, "ctr", top)
	if err != nil || ms[0].Type != "overlay" {
		t.Errorf("container on the relabelled layer: %+v, %v; want an overlay", ms, err)
	}
}

// waitForPid waits for the stand-in mkfs to write its pid.
func waitForPid(t *testing.T, path string) int {
	t.Helper()
	var pid int
	testenv.Eventually(t, 30*time.Second, "mkfs started", func() error {
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err
	})
	return pid
}

// leftovers counts the entries of root/sub.
func leftovers(t *testing.T, root, sub string) int {
	t.Helper()
	des, err := os.ReadDir(filepath.Join(root, sub))
	if err != nil {
		t.Fatal(err)
	}
	return len(des)
}

// mountsUnder lists the host's mount points under root.
func mountsUnder(t *testing.T, root string) []string {
	t.Helper()
	ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(root))
	if err != nil {
		t.Fatal(err)
	}
	var points []string
	for _, m := range ms {
		points = append(points, m.Mountpoint)
	}
	return points
}
