package server

import (
	"fmt"
	"os"
	"runtime"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/ocimount"
)

// A snapshot image's processes run in the guest's own root, which the
// agent and its files share. A Rootfs without a disk (no serial) confines
// that root for them: a mount namespace of their own, a slave of the
// agent's, where the root is read-only and the masked and read-only paths
// are applied, as runc applies them in the container's. Each process
// forks from a thread that joined it (see takeSettings); the agent keeps
// writing the guest's files in its own.

// guestRoot is the namespace, and the Rootfs it was made for.
type guestRoot struct {
	ns *os.File
	r  *api.Rootfs
}

// checkGuestRoot checks a Rootfs without a disk: confinement alone.
func checkGuestRoot(r *api.Rootfs) error {
	if r.Fstype != "" || len(r.Mounts) > 0 {
		return fmt.Errorf("rootfs without a disk serial (the guest's own root) has fstype %q and %d mounts, expected neither: %w",
			r.Fstype, len(r.Mounts), errdefs.ErrInvalidArgument)
	}
	return nil
}

// confineGuestRoot makes the namespace, once per boot: the same r again
// is a no-op (a restored fork), another one an error.
func (s *Service) confineGuestRoot(r *api.Rootfs, clk *api.Clock) error {
	if cur := s.guestRoot.Load(); cur != nil {
		clk.Skip()
		if !proto.Equal(cur.r, r) {
			return fmt.Errorf("the guest's root is already confined another way; that needs a new VM: %w", errdefs.ErrFailedPrecondition)
		}
		return nil
	}
	made := make(chan error, 1)
	var ns *os.File
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends in the namespace it made
		var err error
		ns, err = newGuestRootNS(s.mnt, r)
		made <- err
	}()
	if err := <-made; err != nil {
		return fmt.Errorf("confine the guest's root: %w", err)
	}
	s.guestRoot.Store(&guestRoot{ns: ns, r: r})
	clk.Lap(api.PhaseConfine)
	return nil
}

// newGuestRootNS moves this thread to a new mount namespace, confines its
// root there and returns a handle on it, which keeps it once the thread
// is gone.
func newGuestRootNS(mnt Mounter, r *api.Rootfs) (*os.File, error) {
	if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
		return nil, fmt.Errorf("unshare the mount namespace: %w", err)
	}
	// A slave: what the agent mounts later shows there, nothing mounted
	// there shows in the agent's.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return nil, fmt.Errorf("make the root a slave: %w", err)
	}
	m := ocimount.NewStack(mnt)
	if err := m.Confine("/", r.MaskedPaths, r.ReadonlyPaths, r.Readonly); err != nil {
		return nil, err
	}
	return os.Open("/proc/thread-self/ns/mnt")
}

// enterGuestRoot moves this thread, locked for good, to ns.
func enterGuestRoot(ns *os.File) error {
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare the file system context: %w", err)
	}
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("enter the confined root's mount namespace: %w", err)
	}
	return nil
}
