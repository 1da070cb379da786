package server

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/ocimount"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/server/guestfile"
)

// maxSerial is the length of a virtio-blk serial (VIRTIO_BLK_ID_BYTES).
const maxSerial = 20

// Mounter is how Init reaches the rootfs disk and mounts the container's
// root; tests replace it so they never touch the host's devices or mounts.
type Mounter interface {
	// Disk returns the device node of the disk whose serial is serial,
	// an image of size bytes (0: unknown), waiting for it until ctx ends;
	// the guest sees that image, not what the disk's slot held before.
	Disk(ctx context.Context, serial string, size uint64) (string, error)
	ocimount.Mounter
}

// rootfsLayout is where the container's root and its layers live.
type rootfsLayout struct {
	lower  string // the disk, read-only
	rw     string // a tmpfs holding upper and work
	root   string // the overlay: the container's root
	marker string // the Rootfs the root was made from
}

func layout(stateDir string) rootfsLayout {
	return rootfsLayout{
		lower:  filepath.Join(stateDir, "lower"),
		rw:     filepath.Join(stateDir, "rw"),
		root:   filepath.Join(stateDir, "root"),
		marker: filepath.Join(stateDir, "rootfs.pb"),
	}
}

// checkRootfs checks r before anything is mounted.
func checkRootfs(r *api.Rootfs) error {
	if r.Serial == "" {
		return checkGuestRoot(r)
	}
	if r.Fstype != "erofs" && r.Fstype != "ext4" {
		return fmt.Errorf("fstype %q: expected erofs or ext4: %w", r.Fstype, errdefs.ErrInvalidArgument)
	}
	if r.Serial == "" || len(r.Serial) > maxSerial || filepath.Base(r.Serial) != r.Serial {
		return fmt.Errorf("serial %q: expected a virtio-blk serial of 1..%d characters: %w", r.Serial, maxSerial, errdefs.ErrInvalidArgument)
	}
	for _, m := range r.Mounts {
		if err := ocimount.Check(ociMount(m)); err != nil {
			return err
		}
	}
	return nil
}

// ociMount is m as the spec said it.
func ociMount(m *api.Mount) specs.Mount {
	return specs.Mount{Destination: m.Destination, Type: m.Type, Source: m.Source, Options: m.Options}
}

// mountRootLayers mounts dev read-only at l.lower, a tmpfs at l.rw and the
// overlay of the two at l.root.
func mountRootLayers(s *ocimount.Stack, l rootfsLayout, dev, fstype string) error {
	upper, work := filepath.Join(l.rw, "upper"), filepath.Join(l.rw, "work")
	for _, d := range []string{l.lower, l.rw, l.root} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("make %s: %w", d, err)
		}
	}
	data := ""
	if fstype == "ext4" {
		data = "noload" // never replay a journal on a read-only disk
	}
	if err := s.Mount(dev, l.lower, fstype, unix.MS_RDONLY, data); err != nil {
		return err
	}
	if err := s.Mount("tmpfs", l.rw, "tmpfs", 0, "mode=0755"); err != nil {
		return err
	}
	for _, d := range []string{upper, work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("make %s: %w", d, err)
		}
	}
	return s.Mount("overlay", l.root, "overlay", 0,
		fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", l.lower, upper, work))
}

// containerRoot is the container's root once Init mounted one, else "".
func (s *Service) containerRoot() string {
	if !s.rootMounted.Load() {
		return ""
	}
	return layout(s.stateDir).root
}

// findRootfs learns whether an earlier run of the agent mounted the
// container's root.
func (s *Service) findRootfs() {
	_, err := os.Stat(layout(s.stateDir).marker)
	s.rootMounted.Store(err == nil)
}

// setupRootfs mounts r's disk read-only under a tmpfs-backed overlay and
// the mounts inside it. Once per boot: the same r again is a no-op (a
// restored fork), a different one an error. A failure unmounts what it
// mounted, so Init can be retried.
func (s *Service) setupRootfs(ctx context.Context, r *api.Rootfs, clk *api.Clock) error {
	if r == nil {
		return nil
	}
	if s.mnt == nil {
		return fmt.Errorf("this agent mounts no rootfs: %w", errdefs.ErrFailedPrecondition)
	}
	if r.Serial == "" {
		return s.confineGuestRoot(r, clk)
	}
	l := layout(s.stateDir)
	if done, err := sameRootfs(l.marker, r); done || err != nil {
		clk.Skip()
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, diskWait)
	defer cancel()
	dev, err := s.mnt.Disk(ctx, r.Serial, r.Size)
	if err != nil {
		return err
	}
	clk.Lap(api.PhaseDisk)
	m := ocimount.NewStack(s.mnt)
	if err := mountRootLayers(m, l, dev, r.Fstype); err != nil {
		return errors.Join(err, m.Undo())
	}
	for _, mount := range r.Mounts {
		if err := m.Container(l.root, ociMount(mount)); err != nil {
			return errors.Join(err, m.Undo())
		}
	}
	last := api.PhaseRootfs
	if confines(r) {
		clk.Lap(api.PhaseRootfs)
		last = api.PhaseConfine
	}
	if err := m.Confine(l.root, r.MaskedPaths, r.ReadonlyPaths, r.Readonly); err != nil {
		return errors.Join(err, m.Undo())
	}
	b, err := proto.Marshal(r)
	if err == nil {
		err = guestfile.WriteFile(&api.File{Path: l.marker, Data: b, Mode: 0o600})
	}
	if err != nil {
		return errors.Join(fmt.Errorf("record the rootfs: %w", err), m.Undo())
	}
	s.rootMounted.Store(true)
	clk.Lap(last)
	return nil
}

// confines says whether r asks for masked or read-only paths or a
// read-only root.
func confines(r *api.Rootfs) bool {
	return r.Readonly || len(r.MaskedPaths) > 0 || len(r.ReadonlyPaths) > 0
}

// sameRootfs says whether r is already mounted; an error if another one is.
func sameRootfs(marker string, r *api.Rootfs) (bool, error) {
	cur, err := mountedRootfs(marker)
	if cur == nil || err != nil {
		return false, err
	}
	if !proto.Equal(cur, r) {
		return false, fmt.Errorf("the guest already has the rootfs of disk %q; another one needs a new VM: %w", cur.Serial, errdefs.ErrFailedPrecondition)
	}
	return true, nil
}

// mountedRootfs is the Rootfs Init mounted, nil if none.
func mountedRootfs(marker string) (*api.Rootfs, error) {
	b, err := os.ReadFile(marker)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	var cur api.Rootfs
	if err == nil {
		err = proto.Unmarshal(b, &cur)
	}
	if err != nil {
		return nil, fmt.Errorf("read the mounted rootfs: %w", err)
	}
	return &cur, nil
}

// containerRoots mounts the roots of containers joining the VM on a disk
// slot, as Init mounts its own: the disk read-only under an overlay whose
// upper is a tmpfs of the container's.
type containerRoots struct{ s *Service }

func containerLayout(dir string) rootfsLayout {
	return rootfsLayout{lower: filepath.Join(dir, "lower"), rw: filepath.Join(dir, "rw"), root: filepath.Join(dir, "rootfs")}
}

// Mount mounts r's disk for a container whose dir is dir.
func (c containerRoots) Mount(ctx context.Context, r *api.Rootfs, dir string, clk *api.Clock) (string, error) {
	if err := checkRootfs(r); err != nil {
		return "", err
	}
	if err := c.notInitRoot(r.Serial); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, diskWait)
	defer cancel()
	dev, err := c.s.mnt.Disk(ctx, r.Serial, r.Size)
	if err != nil {
		return "", err
	}
	clk.Lap(api.PhaseDisk)
	l := containerLayout(dir)
	m := ocimount.NewStack(c.s.mnt)
	if err := mountRootLayers(m, l, dev, r.Fstype); err != nil {
		return "", errors.Join(err, m.Undo())
	}
	return l.root, nil
}

// notInitRoot refuses the disk Init mounted as the VM's container root.
func (c containerRoots) notInitRoot(serial string) error {
	cur, err := mountedRootfs(layout(c.s.stateDir).marker)
	if err != nil {
		return err
	}
	if cur != nil && cur.Serial == serial {
		return fmt.Errorf("disk %q is the root Init mounted: %w", serial, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// MountVolume mounts v's disk read-only at its path, which must be under
// the copies of bind sources.
func (c containerRoots) MountVolume(ctx context.Context, v *api.VolumeDisk) error {
	if err := guestfile.Beneath(filepath.Join(c.s.stateDir, bindCopies), v.Path); err != nil {
		return err
	}
	if err := checkRootfs(&api.Rootfs{Serial: v.Serial, Fstype: v.Fstype}); err != nil {
		return err
	}
	if err := c.notInitRoot(v.Serial); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, diskWait)
	defer cancel()
	dev, err := c.s.mnt.Disk(ctx, v.Serial, v.Size)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(v.Path, 0o755); err != nil {
		return fmt.Errorf("make mount point %s: %w", v.Path, err)
	}
	return c.s.mnt.Mount(dev, v.Path, v.Fstype, unix.MS_RDONLY|unix.MS_NODEV|unix.MS_NOSUID, "")
}

// UnmountVolume unmounts what MountVolume mounted.
func (c containerRoots) UnmountVolume(v *api.VolumeDisk) error {
	return c.s.mnt.Unmount(v.Path)
}

// Unmount unmounts what Mount mounted in dir, the overlay first.
func (c containerRoots) Unmount(dir string) error {
	l := containerLayout(dir)
	m := ocimount.NewStack(c.s.mnt)
	m.Adopt(l.lower, l.rw, l.root)
	return m.Undo()
}
