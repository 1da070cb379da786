package qemu

import (
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	hostattach "github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/attach"
)

// attach is what a QEMU inherits beyond its QMP listener.
type attach struct {
	// memfd is the guest RAM of a copy restore (fd 4, memfdChildPath);
	// the VM owns it once spawned.
	memfd *os.File
	// tap is the NIC's tap queue; the caller keeps and closes its copy.
	tap *os.File
	// netns is the network namespace QEMU runs in; nil keeps ours.
	netns *os.File
	// bornIn forks QEMU in the VM's cgroup; nil in ours.
	bornIn func(*syscall.SysProcAttr, func() error) error
}

// attachFor checks the network namespace, NIC and disk req asks for, so a
// wrong one fails before anything starts rather than in QEMU's log, and
// returns what QEMU inherits for them and the disk's absolute path ("" for
// none) for the command line: QEMU runs in its run directory, where a
// relative path would name another file.
func attachFor(req hypervisor.RestoreRequest) (a attach, disk string, err error) {
	if req.NetNS != nil {
		if err := hostattach.CheckNetNS(req.NetNS); err != nil {
			return attach{}, "", err
		}
	}
	a = attach{netns: req.NetNS, bornIn: req.BornIn()}
	if req.NIC != nil {
		if req.NIC.TapFile == nil {
			return attach{}, "", fmt.Errorf("nic %q has no tap file: QEMU takes the tap as an open fd", req.NIC.TapName)
		}
		if err := checkTap(req.NIC.TapFile); err != nil {
			return attach{}, "", err
		}
		a.tap = req.NIC.TapFile
	}
	if req.Disk != "" {
		if disk, err = hostattach.CheckDisk(req.Disk); err != nil {
			return attach{}, "", err
		}
	}
	return a, disk, nil
}

// files lists the fds QEMU inherits after the QMP listener, and the
// child's fd number of the tap (0 without one).
func (a attach) files() (extra []*os.File, tapFD int) {
	if a.memfd != nil {
		extra = append(extra, a.memfd)
	}
	if a.tap != nil {
		extra = append(extra, a.tap)
		tapFD = qmpChildFD + len(extra)
	}
	return extra, tapFD
}

// checkTap refuses a tap the snapshot's NIC cannot use: a tun device, a
// tap with packet info, or one with a vnet header (QEMU would offer the
// guest offloads the snapshot's NIC never had, and the NIC would no
// longer match the migration stream).
func checkTap(f *os.File) error {
	ifr, err := unix.NewIfreq("")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(int(f.Fd()), unix.TUNGETIFF, ifr); err != nil {
		return fmt.Errorf("nic tap file %s: TUNGETIFF: %w (want an open tap queue)", f.Name(), err)
	}
	flags := ifr.Uint16()
	if flags&unix.IFF_TAP == 0 || flags&unix.IFF_NO_PI == 0 || flags&unix.IFF_VNET_HDR != 0 {
		return fmt.Errorf("nic tap %s has flags %#x: want IFF_TAP|IFF_NO_PI without IFF_VNET_HDR", ifr.Name(), flags)
	}
	return nil
}
