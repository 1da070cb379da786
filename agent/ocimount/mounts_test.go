package ocimount

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// fakeMounter records what it was asked to do; a mount at failAt fails.
type fakeMounter struct {
	did    []string
	failAt string
}

func mountEntry(source, target, fstype string, flags uintptr, data string) string {
	return fmt.Sprintf("mount %s %s %s %#x %s", source, target, fstype, flags, data)
}

func (m *fakeMounter) Mount(source, target, fstype string, flags uintptr, data string) error {
	m.did = append(m.did, mountEntry(source, target, fstype, flags, data))
	if target == m.failAt {
		return errors.New("fake mount failure")
	}
	return nil
}

func (m *fakeMounter) Unmount(target string) error {
	m.did = append(m.did, "unmount "+target)
	return nil
}

func (m *fakeMounter) Mknod(path string, mode uint32, dev uint64) error {
	m.did = append(m.did, fmt.Sprintf("mknod %s %#o %d", path, mode, dev))
	return os.WriteFile(path, nil, 0o666)
}

// TestPlanMount: options split into mount flags (later ones winning),
// propagation and file system data; cgroup v1 is v2, a source defaults
// to the type, a devpts is a new instance with an openable ptmx unless
// the spec says otherwise, and a bind keeps no data.
func TestPlanMount(t *testing.T) {
	nodev := uintptr(unix.MS_NOSUID | unix.MS_NOEXEC | unix.MS_NODEV)
	for _, tc := range []struct {
		name string
		m    specs.Mount
		want mountPlan
	}{
		{"proc", specs.Mount{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			mountPlan{dst: "/proc", fstype: "proc", source: "proc", flags: nodev}},
		{"data and a cleared flag", specs.Mount{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"ro", "nosuid", "rw", "mode=1777", "size=65536k"}},
			mountPlan{dst: "/dev/shm", fstype: "tmpfs", source: "shm", flags: unix.MS_NOSUID, data: "mode=1777,size=65536k"}},
		{"devpts defaults", specs.Mount{Destination: "/dev/pts", Type: "devpts", Options: []string{"gid=5"}},
			mountPlan{dst: "/dev/pts", fstype: "devpts", source: "devpts", data: "gid=5,newinstance,ptmxmode=0666"}},
		{"devpts as the spec says", specs.Mount{Destination: "/dev/pts", Type: "devpts", Options: []string{"newinstance", "ptmxmode=0600"}},
			mountPlan{dst: "/dev/pts", fstype: "devpts", source: "devpts", data: "newinstance,ptmxmode=0600"}},
		{"cgroup v1 is v2", specs.Mount{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"ro", "relatime"}},
			mountPlan{dst: "/sys/fs/cgroup", fstype: "cgroup2", source: "cgroup", flags: unix.MS_RDONLY | unix.MS_RELATIME}},
		{"bind type", specs.Mount{Destination: "/etc/hosts", Type: "bind", Source: "/run/hosts", Options: []string{"rbind", "rprivate", "ro", "x=y"}},
			mountPlan{dst: "/etc/hosts", source: "/run/hosts", flags: unix.MS_BIND | unix.MS_REC | unix.MS_RDONLY, propagation: unix.MS_PRIVATE | unix.MS_REC}},
		{"bind option", specs.Mount{Destination: "/data", Type: "none", Source: "/srv", Options: []string{"bind", "nodev"}},
			mountPlan{dst: "/data", source: "/srv", flags: unix.MS_BIND | unix.MS_NODEV}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := planMount(tc.m)
			if err != nil || got != tc.want {
				t.Errorf("planMount: %+v %v, want %+v", got, err, tc.want)
			}
		})
	}
}

// TestCheck: what cannot be mounted in the guest is an invalid argument
// naming the mount.
func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    specs.Mount
		want string // "" for no error
	}{
		{"tmpfs", specs.Mount{Destination: "/tmp", Type: "tmpfs"}, ""},
		{"bind", specs.Mount{Destination: "/etc/hosts", Type: "bind", Source: "/run/hosts"}, ""},
		{"relative destination", specs.Mount{Destination: "tmp", Type: "tmpfs"}, `mount at "tmp": expected an absolute destination`},
		{"unsupported type", specs.Mount{Destination: "/data", Type: "nfs", Source: "srv:/x"},
			`mount at "/data": type "nfs" is not supported in the guest, expected bind or one of [cgroup cgroup2 devpts`},
		{"relative bind source", specs.Mount{Destination: "/data", Type: "none", Source: "srv", Options: []string{"rbind"}},
			`bind mount at "/data": source "srv": expected an absolute guest path`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.m)
			if tc.want == "" {
				if err != nil {
					t.Errorf("Check: %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Check: %v, want invalid argument saying %q", err, tc.want)
			}
		})
	}
}

// TestContainer: a mount is made inside the root, whatever symlinks lead
// out of it; a tmpfs /dev gets runc's devices and links; a bind makes its
// mount point as its source is (a file here), and its other flags and
// propagation take calls of their own.
func TestContainer(t *testing.T) {
	root, src := t.TempDir(), filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(src, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/", filepath.Join(root, "escape")); err != nil {
		t.Fatal(err)
	}
	in := func(p string) string { return filepath.Join(root, p) }
	mnt := &fakeMounter{}
	s := NewStack(mnt)
	for _, m := range []specs.Mount{
		{Destination: "/escape/a", Type: "tmpfs"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "mode=755"}},
		{Destination: "/etc/hosts", Type: "bind", Source: src, Options: []string{"rbind", "rprivate", "ro"}},
	} {
		if err := s.Container(root, m); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{
		mountEntry("tmpfs", in("a"), "tmpfs", 0, ""),
		mountEntry("tmpfs", in("dev"), "tmpfs", unix.MS_NOSUID, "mode=755"),
	}
	for _, d := range defaultDevices {
		want = append(want, fmt.Sprintf("mknod %s %#o %d", in("dev/"+d.name), unix.S_IFCHR|0o666, unix.Mkdev(d.major, d.minor)))
	}
	want = append(want,
		mountEntry(src, in("etc/hosts"), "", unix.MS_BIND|unix.MS_REC, ""),
		mountEntry("", in("etc/hosts"), "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""),
		mountEntry("", in("etc/hosts"), "", unix.MS_PRIVATE|unix.MS_REC, ""),
	)
	if !slices.Equal(mnt.did, want) {
		t.Errorf("did\n%s\nwant\n%s", strings.Join(mnt.did, "\n"), strings.Join(want, "\n"))
	}
	if fi, err := os.Stat(in("etc/hosts")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("the mount point of a bound file is %v %v, want a file", fi, err)
	}
	for _, l := range [][2]string{{"ptmx", "pts/ptmx"}, {"fd", "/proc/self/fd"}, {"stderr", "/proc/self/fd/2"}} {
		if got, err := os.Readlink(in("dev/" + l[0])); err != nil || got != l[1] {
			t.Errorf("/dev/%s links to %q %v, want %s", l[0], got, err, l[1])
		}
	}
}

// TestUndo: Undo unmounts what the stack mounted and adopted, last first,
// but not what only changed a mount; a bind whose source is missing fails
// before mounting anything.
func TestUndo(t *testing.T) {
	root := t.TempDir()
	mnt := &fakeMounter{failAt: filepath.Join(root, "sys")}
	s := NewStack(mnt)
	s.Adopt("/lower", "/rw")
	if err := s.Container(root, specs.Mount{Destination: "/etc", Type: "tmpfs", Options: []string{"ro", "rshared"}}); err != nil {
		t.Fatal(err)
	}
	err := s.Container(root, specs.Mount{Destination: "/etc/hosts", Type: "bind", Source: "/no/such/file"})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), `bind mount at "/etc/hosts": nothing at "/no/such/file"`) {
		t.Errorf("a missing bind source: %v, want invalid argument", err)
	}
	if err := s.Container(root, specs.Mount{Destination: "/sys", Type: "sysfs"}); err == nil || !strings.Contains(err.Error(), "mount sysfs at "+root+"/sys") {
		t.Errorf("a failing mount: %v, want an error naming it", err)
	}
	mnt.did = nil
	if err := s.Undo(); err != nil {
		t.Fatal(err)
	}
	if err := s.Undo(); err != nil {
		t.Fatal(err)
	}
	want := []string{"unmount " + root + "/etc", "unmount /rw", "unmount /lower"}
	if !slices.Equal(mnt.did, want) {
		t.Errorf("undo did %v, want %v", mnt.did, want)
	}
}
