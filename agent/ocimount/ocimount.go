// Package ocimount makes an OCI spec's mounts inside a container's root as
// runc does, and confines the root: masked paths, read-only paths and a
// read-only root. The agent and the container init run in the guest both
// use it, so it imports nothing with a heavy init (no protobuf, no
// logging): the init's start stays short.
package ocimount

import "golang.org/x/sys/unix"

// Mounter makes and undoes mounts and device nodes; tests replace it so
// they never touch the host's mounts or devices.
type Mounter interface {
	Mount(source, target, fstype string, flags uintptr, data string) error
	// Unmount detaches target; a Stack undoes a half-made root with it.
	Unmount(target string) error
	// Mknod makes a device node with exactly mode (the umask aside).
	Mknod(path string, mode uint32, dev uint64) error
}

// System is the Mounter of the running kernel.
type System struct{}

// Mount is mount(2).
func (System) Mount(source, target, fstype string, flags uintptr, data string) error {
	return unix.Mount(source, target, fstype, flags, data)
}

// Unmount detaches target.
func (System) Unmount(target string) error {
	return unix.Unmount(target, unix.MNT_DETACH)
}

// Mknod makes a node with exactly mode: mknod(2) applies the umask.
func (System) Mknod(path string, mode uint32, dev uint64) error {
	if err := unix.Mknod(path, mode, int(dev)); err != nil {
		return err
	}
	return unix.Chmod(path, mode&0o7777)
}
