package server

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// ociMounts are the mounts containerd's default spec gives a container,
// plus a resolver file bound from a guest path.
func ociMounts(resolv string) []*api.Mount {
	return []*api.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
		{Destination: "/etc/resolv.conf", Type: "bind", Source: resolv, Options: []string{"rbind", "rprivate", "ro"}},
	}
}

func mountEntry(source, target, fstype string, flags uintptr, data string) string {
	return fmt.Sprintf("mount %s %s %s %#x %s", source, target, fstype, flags, data)
}

// TestRootfsMounts: the disk goes read-only under a tmpfs overlay, then
// every OCI mount is made inside the root with its flags and data, /dev
// gets runc's devices, and a bind mount's source is the guest file.
func TestRootfsMounts(t *testing.T) {
	g := newFakeGuest(t)
	files := t.TempDir()
	resolv := filepath.Join(files, "resolv.conf")
	r := &api.InitRequest{
		Files:  []*api.File{{Path: resolv, Data: []byte("nameserver 10.0.0.1\n")}},
		Rootfs: &api.Rootfs{Fstype: "ext4", Serial: "cocoon-rootfs", Mounts: ociMounts(resolv)},
	}
	if _, err := g.svc.Init(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	s, root := g.state, g.root()
	in := func(p string) string { return filepath.Join(root, p) }
	want := []string{
		"network false ",
		"disk cocoon-rootfs",
		mountEntry("/dev/vdz", s+"/lower", "ext4", unix.MS_RDONLY, "noload"),
		mountEntry("tmpfs", s+"/rw", "tmpfs", 0, "mode=0755"),
		mountEntry("overlay", root, "overlay", 0, fmt.Sprintf("lowerdir=%s/lower,upperdir=%s/rw/upper,workdir=%s/rw/work", s, s, s)),
		mountEntry("proc", in("proc"), "proc", unix.MS_NOSUID|unix.MS_NOEXEC|unix.MS_NODEV, ""),
		mountEntry("tmpfs", in("dev"), "tmpfs", unix.MS_NOSUID|unix.MS_STRICTATIME, "mode=755,size=65536k"),
	}
	node := func(name string, major, minor uint32) string {
		return fmt.Sprintf("mknod %s %#o %d", in("dev/"+name), unix.S_IFCHR|0o666, unix.Mkdev(major, minor))
	}
	want = append(want, node("null", 1, 3), node("zero", 1, 5), node("full", 1, 7),
		node("random", 1, 8), node("urandom", 1, 9), node("tty", 5, 0))
	nodev := uintptr(unix.MS_NOSUID | unix.MS_NOEXEC | unix.MS_NODEV)
	want = append(want,
		mountEntry("devpts", in("dev/pts"), "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5"),
		mountEntry("shm", in("dev/shm"), "tmpfs", nodev, "mode=1777,size=65536k"),
		mountEntry("mqueue", in("dev/mqueue"), "mqueue", nodev, ""),
		mountEntry("sysfs", in("sys"), "sysfs", nodev|unix.MS_RDONLY, ""),
		mountEntry("cgroup", in("sys/fs/cgroup"), "cgroup2", nodev|unix.MS_RDONLY|unix.MS_RELATIME, ""),
		mountEntry(resolv, in("etc/resolv.conf"), "", unix.MS_BIND|unix.MS_REC, ""),
		mountEntry("", in("etc/resolv.conf"), "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""),
		mountEntry("", in("etc/resolv.conf"), "", unix.MS_PRIVATE|unix.MS_REC, ""),
	)
	if got := g.j.all(); !slices.Equal(got, want) {
		t.Errorf("did\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if fi, err := os.Stat(in("etc/resolv.conf")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("the mount point of a bound file is %v %v, want a file", fi, err)
	}
	if l, err := os.Readlink(in("dev/ptmx")); err != nil || l != "pts/ptmx" {
		t.Errorf("/dev/ptmx links to %q %v, want pts/ptmx", l, err)
	}
	if got := g.svc.containerRoot(); got != root {
		t.Errorf("container root %q, want %q", got, root)
	}
}

// TestRootfsOncePerBoot: the same rootfs again (a restored fork, or after
// the agent restarted) mounts nothing; another one is refused.
func TestRootfsOncePerBoot(t *testing.T) {
	g := newFakeGuest(t)
	r := &api.InitRequest{Rootfs: &api.Rootfs{Fstype: "erofs", Serial: "cocoon-rootfs"}}
	if _, err := g.svc.Init(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	before := len(g.j.all())
	restarted := New(g.sys, WithNetwork(g.net), WithMounter(g.mnt), WithStateDir(g.state))
	for _, svc := range []*Service{g.svc, restarted} {
		if _, err := svc.Init(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	if after := g.j.all()[before:]; slices.ContainsFunc(after, func(e string) bool { return !strings.HasPrefix(e, "network") }) {
		t.Errorf("the same rootfs again did %v", after)
	}
	other := &api.InitRequest{Rootfs: &api.Rootfs{Fstype: "erofs", Serial: "other"}}
	if _, err := g.svc.Init(context.Background(), other); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), `already has the rootfs of disk "cocoon-rootfs"`) {
		t.Errorf("another rootfs: %v, want failed precondition", err)
	}
}

// TestRootfsUndo: a failing mount undoes the mounts before it, last first,
// and Init can be retried.
func TestRootfsUndo(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mounts []*api.Mount
		failAt string
		want   string
		undone []string // under the state dir, last first
	}{
		{"mount fails", ociMounts("/etc/hostname"), "root/sys", "mount sysfs at",
			[]string{"root/dev/mqueue", "root/dev/shm", "root/dev/pts", "root/dev", "root/proc", "root", "rw", "lower"}},
		{"bind source missing", []*api.Mount{
			{Destination: "/proc", Type: "proc"},
			{Destination: "/etc/hosts", Type: "bind", Source: "/no/such/file", Options: []string{"rbind"}},
		}, "", `bind mount at "/etc/hosts": nothing at "/no/such/file", where the host puts the copy of its source`,
			[]string{"root/proc", "root", "rw", "lower"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newFakeGuest(t)
			if tc.failAt != "" {
				g.mnt.failAt = filepath.Join(g.state, tc.failAt)
			}
			r := &api.InitRequest{Rootfs: &api.Rootfs{Fstype: "ext4", Serial: "s", Mounts: tc.mounts}}
			_, err := g.svc.Init(context.Background(), r)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Init: %v, want an error saying %q", err, tc.want)
			}
			var want, unmounted []string
			for _, u := range tc.undone {
				want = append(want, filepath.Join(g.state, u))
			}
			for _, e := range g.j.all() {
				if f := strings.Fields(e); f[0] == "unmount" {
					unmounted = append(unmounted, f[1])
				}
			}
			if !slices.Equal(unmounted, want) {
				t.Errorf("unmounted %v, want %v", unmounted, want)
			}
			if g.svc.containerRoot() != "" {
				t.Error("a failed rootfs counts as mounted")
			}
			g.mnt.failAt = ""
			r.Rootfs.Mounts = nil
			if _, err := g.svc.Init(context.Background(), r); err != nil {
				t.Errorf("retry: %v", err)
			}
		})
	}
}

// TestMountsStayInRoot: an image's symlinks cannot point a mount outside
// the container's root.
func TestMountsStayInRoot(t *testing.T) {
	g := newFakeGuest(t)
	root := g.root()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{"escape": "/", "etc/up": "../../../.."} {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	r := &api.InitRequest{Rootfs: &api.Rootfs{Fstype: "ext4", Serial: "s", Mounts: []*api.Mount{
		{Destination: "/escape/a", Type: "tmpfs"},
		{Destination: "/etc/up/b", Type: "tmpfs"},
	}}}
	if _, err := g.svc.Init(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	all := g.j.all()
	for i, want := range []string{filepath.Join(root, "a"), filepath.Join(root, "b")} {
		if e := all[len(all)-2+i]; strings.Fields(e)[2] != want {
			t.Errorf("mount %q, want it at %s", e, want)
		}
	}
}
