// Package attach checks the host ends a restore request gives a VMM that
// opens them itself, by name (Cloud Hypervisor, Firecracker): the network
// namespace it runs in, the tap behind the snapshot's NIC, and the
// filesystem image behind its rootfs slot. Everything is checked before the
// VMM starts, so a wrong host end fails the restore with an error naming it
// instead of a VMM that quietly creates a fresh tap (TUNSETIFF creates a
// device whose name does not exist) or dies in its log.
package attach

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// Check checks req's network namespace, NIC and disk, and returns the
// disk's absolute path ("" without one): the VMM runs in its run
// directory, where a relative path would name another file.
func Check(req hypervisor.RestoreRequest) (disk string, err error) {
	if req.NetNS != nil {
		if err := CheckNetNS(req.NetNS); err != nil {
			return "", err
		}
	}
	if req.NIC != nil {
		if err := CheckTap(req.NetNS, req.NIC); err != nil {
			return "", err
		}
	}
	if req.Disk == "" {
		return "", nil
	}
	return CheckDisk(req.Disk)
}

// CheckNetNS wants f to be a network namespace (an nsfs file such as
// /proc/PID/ns/net or a /run/netns bind mount).
func CheckNetNS(f *os.File) error {
	t, err := unix.IoctlRetInt(int(f.Fd()), unix.NS_GET_NSTYPE)
	if err != nil {
		return fmt.Errorf("network namespace %s: %w (want an nsfs file such as /proc/PID/ns/net)", f.Name(), err)
	}
	if t != unix.CLONE_NEWNET {
		return fmt.Errorf("network namespace %s is a namespace of another type (%#x)", f.Name(), t)
	}
	return nil
}

// CheckTap wants nic's tap to be one a VMM can open by name in ns (nil:
// ours): a persistent single-queue tap that exists there, and nic.TapFile,
// if set, a queue of it, which ReleaseQueue then frees. Whether another
// process holds the tap's queue, netlink does not tell for a single-queue
// tap: the VMM's open then fails with EBUSY.
func CheckTap(ns *os.File, nic *hypervisor.NIC) error {
	if err := checkName(nic.TapName); err != nil {
		return err
	}
	link, err := tapLink(ns, nic.TapName)
	if err != nil {
		return err
	}
	switch {
	case link.Mode != netlink.TUNTAP_MODE_TAP:
		return fmt.Errorf("nic %q is a tun device: want a tap", nic.TapName)
	case link.NonPersist:
		return fmt.Errorf("nic tap %q is not persistent: it would vanish when its queue is released for the hypervisor", nic.TapName)
	case link.Flags&netlink.TUNTAP_MULTI_QUEUE != 0:
		return fmt.Errorf("nic tap %q is multi-queue: the snapshot's NIC opens one queue", nic.TapName)
	}
	if nic.TapFile != nil {
		return checkQueueOf(nic)
	}
	return nil
}

// checkName rejects what TUNSETIFF would misread: a name with '%' is a
// template the kernel fills in, creating a new device.
func checkName(name string) error {
	if name == "" || len(name) >= unix.IFNAMSIZ || strings.ContainsAny(name, "/%: \t\n") {
		return fmt.Errorf("nic tap name %q: want 1-%d characters without '/', '%%', ':' or spaces", name, unix.IFNAMSIZ-1)
	}
	return nil
}

// tapLink finds the tap name in ns (nil: ours).
func tapLink(ns *os.File, name string) (*netlink.Tuntap, error) {
	h, err := handleIn(ns)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	var notFound netlink.LinkNotFoundError
	if errors.As(err, &notFound) {
		return nil, fmt.Errorf("nic tap %q does not exist in %s: the hypervisor opens it by name", name, nsName(ns))
	}
	if err != nil {
		return nil, fmt.Errorf("nic tap %q in %s: %w", name, nsName(ns), err)
	}
	tap, ok := l.(*netlink.Tuntap)
	if !ok {
		return nil, fmt.Errorf("nic %q in %s is a %s link: want a tap", name, nsName(ns), l.Type())
	}
	return tap, nil
}

func handleIn(ns *os.File) (*netlink.Handle, error) {
	if ns == nil {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return nil, fmt.Errorf("open netlink: %w", err)
		}
		return h, nil
	}
	h, err := netlink.NewHandleAt(netns.NsHandle(int(ns.Fd())), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("open netlink in network namespace %s: %w", ns.Name(), err)
	}
	return h, nil
}

func nsName(ns *os.File) string {
	if ns == nil {
		return "the caller's network namespace"
	}
	return "network namespace " + ns.Name()
}

// checkQueueOf wants nic.TapFile to be a queue of nic.TapName: releasing
// any other file would leave the tap held.
func checkQueueOf(nic *hypervisor.NIC) error {
	ifr, err := unix.NewIfreq("")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(int(nic.TapFile.Fd()), unix.TUNGETIFF, ifr); err != nil {
		return fmt.Errorf("nic tap file %s: TUNGETIFF: %w (want an open queue of tap %q)", nic.TapFile.Name(), err, nic.TapName)
	}
	if ifr.Name() != nic.TapName {
		return fmt.Errorf("nic tap file %s is a queue of %q, not of tap %q", nic.TapFile.Name(), ifr.Name(), nic.TapName)
	}
	return nil
}

// ReleaseQueue closes nic.TapFile, the caller's queue of the tap, so that
// the VMM can attach to the tap by name: a single-queue tap takes one
// queue, and TUNSETIFF on a tap that has it fails with EBUSY. The tap is
// persistent (CheckTap), so it stays. Call it right before the request
// that makes the VMM open the tap.
func ReleaseQueue(nic *hypervisor.NIC) error {
	if nic == nil || nic.TapFile == nil {
		return nil
	}
	if err := nic.TapFile.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("release the restore's queue of tap %q: %w", nic.TapName, err)
	}
	return nil
}

// CheckDisk wants path to be a regular file, a filesystem image, and
// returns it absolute.
func CheckDisk(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("rootfs disk %s: %w", path, err)
	}
	st, err := os.Stat(abs)
	if err != nil {
		return "", fmt.Errorf("rootfs disk: %w", err)
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("rootfs disk %s is not a regular file (mode %s): want a filesystem image", path, st.Mode())
	}
	return abs, nil
}
