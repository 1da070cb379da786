package ocimount

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	securejoin "github.com/cyphar/filepath-securejoin"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// mountOptions are the mount(8) flags OCI mounts may carry; other options
// go to the file system as data.
var mountOptions = map[string]struct {
	clear bool
	flag  uintptr
}{
	"ro": {false, unix.MS_RDONLY}, "rw": {true, unix.MS_RDONLY},
	"nosuid": {false, unix.MS_NOSUID}, "suid": {true, unix.MS_NOSUID},
	"nodev": {false, unix.MS_NODEV}, "dev": {true, unix.MS_NODEV},
	"noexec": {false, unix.MS_NOEXEC}, "exec": {true, unix.MS_NOEXEC},
	"sync": {false, unix.MS_SYNCHRONOUS}, "async": {true, unix.MS_SYNCHRONOUS},
	"dirsync": {false, unix.MS_DIRSYNC},
	"noatime": {false, unix.MS_NOATIME}, "atime": {true, unix.MS_NOATIME},
	"nodiratime": {false, unix.MS_NODIRATIME}, "diratime": {true, unix.MS_NODIRATIME},
	"relatime": {false, unix.MS_RELATIME}, "norelatime": {true, unix.MS_RELATIME},
	"strictatime": {false, unix.MS_STRICTATIME}, "nostrictatime": {true, unix.MS_STRICTATIME},
	"nosymfollow": {false, unix.MS_NOSYMFOLLOW}, "symfollow": {true, unix.MS_NOSYMFOLLOW},
	"bind":  {false, unix.MS_BIND},
	"rbind": {false, unix.MS_BIND | unix.MS_REC},
}

// propagationOptions change a mount's propagation once it is made.
var propagationOptions = map[string]uintptr{
	"private": unix.MS_PRIVATE, "rprivate": unix.MS_PRIVATE | unix.MS_REC,
	"shared": unix.MS_SHARED, "rshared": unix.MS_SHARED | unix.MS_REC,
	"slave": unix.MS_SLAVE, "rslave": unix.MS_SLAVE | unix.MS_REC,
	"unbindable": unix.MS_UNBINDABLE, "runbindable": unix.MS_UNBINDABLE | unix.MS_REC,
}

// fileSystems are the types a container mount may have, and what the
// guest mounts for each.
var fileSystems = map[string]string{
	"proc": "proc", "sysfs": "sysfs", "tmpfs": "tmpfs", "devtmpfs": "devtmpfs",
	"devpts": "devpts", "mqueue": "mqueue", "cgroup2": "cgroup2",
	// The guest has no cgroup v1 hierarchies: "cgroup" is v2, as runc
	// mounts it on a unified host.
	"cgroup": "cgroup2",
}

// mountPlan is a checked OCI mount.
type mountPlan struct {
	dst         string
	fstype      string // "" for a bind mount
	source      string
	flags       uintptr
	propagation uintptr
	data        string
}

func (p mountPlan) bind() bool { return p.flags&unix.MS_BIND != 0 }

// Check checks m as Container would before mounting anything: an
// unsupported type, a destination that is not absolute or a bind source
// that is not a guest path is an error naming it.
func Check(m specs.Mount) error {
	_, err := planMount(m)
	return err
}

// planMount checks m and works out the mount(2) call that makes it.
func planMount(m specs.Mount) (mountPlan, error) {
	p := mountPlan{dst: m.Destination, source: m.Source}
	if !filepath.IsAbs(m.Destination) {
		return p, fmt.Errorf("mount at %q: expected an absolute destination: %w", m.Destination, errdefs.ErrInvalidArgument)
	}
	var data []string
	for _, o := range m.Options {
		if f, ok := mountOptions[o]; ok {
			if f.clear {
				p.flags &^= f.flag
			} else {
				p.flags |= f.flag
			}
		} else if f, ok := propagationOptions[o]; ok {
			p.propagation = f
		} else {
			data = append(data, o)
		}
	}
	if m.Type == "bind" {
		p.flags |= unix.MS_BIND
	}
	if p.bind() {
		if !filepath.IsAbs(m.Source) {
			return p, fmt.Errorf("bind mount at %q: source %q: expected an absolute guest path: %w", m.Destination, m.Source, errdefs.ErrInvalidArgument)
		}
		return p, nil
	}
	fstype, ok := fileSystems[m.Type]
	if !ok {
		return p, fmt.Errorf("mount at %q: type %q is not supported in the guest, expected bind or one of %v: %w", m.Destination, m.Type, slices.Sorted(maps.Keys(fileSystems)), errdefs.ErrInvalidArgument)
	}
	p.fstype = fstype
	if fstype == "devpts" {
		data = devptsData(data)
	}
	if p.source == "" {
		p.source = m.Type
	}
	p.data = strings.Join(data, ",")
	return p, nil
}

// devptsData makes a devpts a private instance whose ptmx anyone may open
// (as runc does), unless the spec says otherwise.
func devptsData(data []string) []string {
	if !slices.Contains(data, "newinstance") {
		data = append(data, "newinstance")
	}
	if !slices.ContainsFunc(data, func(o string) bool { return strings.HasPrefix(o, "ptmxmode=") }) {
		data = append(data, "ptmxmode=0666")
	}
	return data
}

// Stack mounts and remembers what, to undo it on failure.
type Stack struct {
	mnt     Mounter
	mounted []string
}

// NewStack is an empty Stack mounting through m.
func NewStack(m Mounter) *Stack { return &Stack{mnt: m} }

// Adopt records targets mounted before, in the order they were mounted,
// so that Undo unmounts them too.
func (s *Stack) Adopt(targets ...string) { s.mounted = append(s.mounted, targets...) }

// Mount mounts source at target and, unless the call only changes a mount
// (a remount, a propagation), remembers target for Undo.
func (s *Stack) Mount(source, target, fstype string, flags uintptr, data string) error {
	if err := s.mnt.Mount(source, target, fstype, flags, data); err != nil {
		what := fstype
		if what == "" {
			what = source
		}
		return fmt.Errorf("mount %s at %s: %w", what, target, err)
	}
	if flags&(unix.MS_REMOUNT|unix.MS_PRIVATE|unix.MS_SHARED|unix.MS_SLAVE|unix.MS_UNBINDABLE) == 0 {
		s.mounted = append(s.mounted, target)
	}
	return nil
}

// Undo unmounts everything mounted, last first.
func (s *Stack) Undo() error {
	var errs []error
	for i := len(s.mounted) - 1; i >= 0; i-- {
		if err := s.mnt.Unmount(s.mounted[i]); err != nil {
			errs = append(errs, fmt.Errorf("unmount %s: %w", s.mounted[i], err))
		}
	}
	s.mounted = nil
	return errors.Join(errs...)
}

// Container makes m inside root; its destination resolves inside root,
// whatever symlinks the image holds.
func (s *Stack) Container(root string, m specs.Mount) error {
	p, err := planMount(m)
	if err != nil {
		return err
	}
	dst, err := securejoin.SecureJoin(root, p.dst)
	if err != nil {
		return fmt.Errorf("mount at %q: %w", p.dst, err)
	}
	if p.bind() {
		err = s.bind(p, dst)
	} else {
		err = s.fileSystem(p, dst)
	}
	if err != nil {
		return err
	}
	if p.propagation != 0 {
		return s.Mount("", dst, "", p.propagation, "")
	}
	return nil
}

func (s *Stack) fileSystem(p mountPlan, dst string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return fmt.Errorf("make mount point %s: %w", p.dst, err)
	}
	if err := s.Mount(p.source, dst, p.fstype, p.flags, p.data); err != nil {
		return err
	}
	if p.dst == "/dev" && p.fstype == "tmpfs" {
		return populateDev(s.mnt, dst)
	}
	return nil
}

// bind mounts a guest path (a file Init wrote, or a directory) into the
// container; flags other than the bind's take a remount.
func (s *Stack) bind(p mountPlan, dst string) error {
	fi, err := os.Stat(p.source)
	if err != nil {
		return fmt.Errorf("bind mount at %q: nothing at %q, where the host puts the copy of its source: %w", p.dst, p.source, errdefs.ErrInvalidArgument)
	}
	if err := MakeMountPoint(dst, fi.IsDir()); err != nil {
		return fmt.Errorf("make mount point %s: %w", p.dst, err)
	}
	if err := s.Mount(p.source, dst, "", p.flags&(unix.MS_BIND|unix.MS_REC), ""); err != nil {
		return err
	}
	if rest := p.flags &^ (unix.MS_BIND | unix.MS_REC); rest != 0 {
		return s.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|rest, "")
	}
	return nil
}

// MakeMountPoint makes what a bind mount at path goes over: a directory,
// or an empty file, with the directories above it.
func MakeMountPoint(path string, dir bool) error {
	if dir {
		return os.MkdirAll(path, 0o755)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

// defaultDevices are the nodes runc gives a container whose /dev is a
// tmpfs, with their modes.
var defaultDevices = []struct {
	name         string
	major, minor uint32
}{
	{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7},
	{"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0},
}

var devLinks = [][2]string{
	{"fd", "/proc/self/fd"}, {"stdin", "/proc/self/fd/0"},
	{"stdout", "/proc/self/fd/1"}, {"stderr", "/proc/self/fd/2"},
	{"ptmx", "pts/ptmx"},
}

// populateDev fills a tmpfs /dev as runc does: the default devices and
// the standard links (ptmx points into the devpts mounted next).
func populateDev(mnt Mounter, dev string) error {
	for _, d := range defaultDevices {
		p := filepath.Join(dev, d.name)
		if err := mnt.Mknod(p, unix.S_IFCHR|0o666, unix.Mkdev(d.major, d.minor)); err != nil {
			return fmt.Errorf("make /dev/%s: %w", d.name, err)
		}
	}
	for _, l := range devLinks {
		if err := os.Symlink(l[1], filepath.Join(dev, l[0])); err != nil {
			return fmt.Errorf("link /dev/%s: %w", l[0], err)
		}
	}
	return nil
}
