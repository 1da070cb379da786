package apifake

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// hostDevs holds the host ends a fake VMM opened for its VM's devices, as
// a real one keeps them open for the VM's life (they close when the fake
// exits).
type hostDevs []*os.File

// openTap opens the tap name in the process's network namespace as Cloud
// Hypervisor (net_util Tap::open_named) and Firecracker do: TUNSETIFF with
// IFF_TAP|IFF_NO_PI|IFF_VNET_HDR, plus IFF_MULTI_QUEUE for more than one
// queue pair. As for them, a name no device has creates a new tap (not
// persistent: it goes when the VMM exits), "" creates one named vmtap%d
// (Tap::new), and a single-queue tap whose queue is held elsewhere fails
// with EBUSY.
func (h *hostDevs) openTap(name string, multiQueue bool) error {
	if name == "" {
		name = "vmtap%d"
	}
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open tap %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), "/dev/net/tun")
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		f.Close()
		return fmt.Errorf("open tap %s: %w", name, err)
	}
	flags := uint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if multiQueue {
		flags |= unix.IFF_MULTI_QUEUE
	}
	ifr.SetUint16(flags)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		f.Close()
		return fmt.Errorf("open tap %s: TUNSETIFF: %w", name, err)
	}
	*h = append(*h, f)
	return nil
}

// diskBlock is how much of an image Cloud Hypervisor reads to detect its
// format (one aligned block); a shorter image fails to open.
const diskBlock = 4096

// openDisk opens a disk image as Cloud Hypervisor does (block::open_disk
// and the image lock of a restore): read-only or read-write, its first
// block read to detect the format, which must be imageType unless that is
// "" or "Unknown", and locked for the VM's life: shared when read-only, so
// VMs can share one image, exclusive otherwise.
func (h *hostDevs) openDisk(path string, readonly bool, imageType string) error {
	flag, lock := os.O_RDWR, int16(unix.F_WRLCK)
	if readonly {
		flag, lock = os.O_RDONLY, unix.F_RDLCK
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return fmt.Errorf("open disk: %w", err)
	}
	if err := checkImage(f, imageType); err != nil {
		f.Close()
		return fmt.Errorf("disk %s: %w", path, err)
	}
	lk := unix.Flock_t{Type: lock, Whence: io.SeekStart}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
		f.Close()
		return fmt.Errorf("lock disk %s: %w", path, err)
	}
	*h = append(*h, f)
	return nil
}

// checkImage detects f's format from its first block, as block's
// detect_image_type does, and wants it to be want.
func checkImage(f *os.File, want string) error {
	block := make([]byte, diskBlock)
	if _, err := f.ReadAt(block, 0); err != nil {
		return fmt.Errorf("detect image type: %w", err)
	}
	got := "Raw"
	switch {
	case bytes.HasPrefix(block, []byte("QFI\xfb")):
		got = "Qcow2"
	case bytes.HasPrefix(block, []byte("vhdxfile")):
		got = "Vhdx"
	}
	if want != "" && want != "Unknown" && want != got {
		return errors.New("image type mismatch: " + want + " specified, " + got + " detected")
	}
	return nil
}

// openFile opens a Firecracker drive's backing file as its block device
// does on load (DiskProperties::new): relative to the working directory,
// read-write unless read-only.
func (h *hostDevs) openFile(path string, readonly bool) error {
	flag := os.O_RDWR
	if readonly {
		flag = os.O_RDONLY
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return fmt.Errorf("open block device backing file: %w", err)
	}
	*h = append(*h, f)
	return nil
}
