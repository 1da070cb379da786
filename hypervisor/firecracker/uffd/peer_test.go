package uffd

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The half of the userfaultfd ABI that Firecracker, not the handler, uses.
const (
	featureEventRemove  = 1 << 3 // UFFD_FEATURE_EVENT_REMOVE
	registerModeMissing = 1 << 0 // UFFDIO_REGISTER_MODE_MISSING
)

var (
	ioctlAPI      = ioc(3, 0x3F, unsafe.Sizeof(apiArg{}))
	ioctlRegister = ioc(3, 0x00, unsafe.Sizeof(registerArg{}))
	ioctlDevNewFD = ioc(0, 0x00, 0) // USERFAULTFD_IOC_NEW on /dev/userfaultfd
)

type apiArg struct {
	API      uint64
	Features uint64
	Ioctls   uint64
}

type registerArg struct {
	Range  rangeArg
	Mode   uint64
	Ioctls uint64
}

// fcPeer plays Firecracker: anonymous guest memory registered MISSING with a
// userfaultfd, handed to the handler with the handshake.
//
// Guest memory is only ever read through process_vm_readv, never by a load
// from Go code: the fault then happens in the kernel on behalf of a syscall,
// as KVM's accesses to guest memory do, and the goroutine waiting for it is
// in a syscall the Go scheduler knows about rather than stuck on a load.
type fcPeer struct {
	mem  []byte
	uffd int
}

// newPeer maps size bytes of guest memory and registers it with a new
// userfaultfd that asked for features.
func newPeer(size int, features uint64) (*fcPeer, error) {
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("map guest memory: %w", err)
	}
	p := &fcPeer{mem: mem, uffd: -1}
	if err := p.register(features); err != nil {
		p.close()
		return nil, err
	}
	return p, nil
}

func (p *fcPeer) register(features uint64) error {
	dev, err := unix.Open("/dev/userfaultfd", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open /dev/userfaultfd: %w", err)
	}
	fd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(dev), ioctlDevNewFD, unix.O_CLOEXEC|unix.O_NONBLOCK)
	unix.Close(dev)
	if errno != 0 {
		return fmt.Errorf("USERFAULTFD_IOC_NEW: %w", errno)
	}
	p.uffd = int(fd)
	api := apiArg{API: uffdAPI, Features: features}
	if err := ioctl(p.uffd, ioctlAPI, unsafe.Pointer(&api)); err != nil {
		return fmt.Errorf("UFFDIO_API: %w", err)
	}
	reg := registerArg{Range: rangeArg{Start: p.base(), Len: uint64(len(p.mem))}, Mode: registerModeMissing}
	if err := ioctl(p.uffd, ioctlRegister, unsafe.Pointer(&reg)); err != nil {
		return fmt.Errorf("UFFDIO_REGISTER: %w", err)
	}
	return nil
}

func (p *fcPeer) base() uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(p.mem)))) }

// mapping describes guest memory [off, off+size) as backed by the file
// from fileOff.
func (p *fcPeer) mapping(off, size, fileOff uint64) Mapping {
	return Mapping{BaseHostVirtAddr: p.base() + off, Size: size, Offset: fileOff, PageSize: uint64(os.Getpagesize())}
}

// handshake connects to sock and sends payload with fds attached; a nil
// payload hangs up without sending.
func handshake(sock string, payload []byte, fds ...int) error {
	conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return fmt.Errorf("dial handler: %w", err)
	}
	defer conn.Close()
	if payload == nil {
		return nil
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := conn.WriteMsgUnix(payload, oob, nil); err != nil {
		return fmt.Errorf("send handshake: %w", err)
	}
	return nil
}

// send performs Firecracker's handshake with the peer's userfaultfd.
func (p *fcPeer) send(sock string, ms ...Mapping) error {
	payload, err := json.Marshal(ms)
	if err != nil {
		return err
	}
	return handshake(sock, payload, p.uffd)
}

// read copies guest memory at off into buf, faulting it in as KVM would.
func (p *fcPeer) read(off int, buf []byte) error {
	local := []unix.Iovec{{Base: &buf[0]}}
	local[0].SetLen(len(buf))
	remote := []unix.RemoteIovec{{Base: uintptr(p.base()) + uintptr(off), Len: len(buf)}}
	n, err := unix.ProcessVMReadv(os.Getpid(), local, remote, 0)
	if err != nil {
		return fmt.Errorf("read guest memory at %#x: %w", off, err)
	}
	if n != len(buf) {
		return fmt.Errorf("read guest memory at %#x: %d of %d bytes", off, n, len(buf))
	}
	return nil
}

// write stores data into guest memory at off, faulting it in as KVM would.
func (p *fcPeer) write(off int, data []byte) error {
	local := []unix.Iovec{{Base: &data[0]}}
	local[0].SetLen(len(data))
	remote := []unix.RemoteIovec{{Base: uintptr(p.base()) + uintptr(off), Len: len(data)}}
	n, err := unix.ProcessVMWritev(os.Getpid(), local, remote, 0)
	if err != nil {
		return fmt.Errorf("write guest memory at %#x: %w", off, err)
	}
	if n != len(data) {
		return fmt.Errorf("write guest memory at %#x: %d of %d bytes", off, n, len(data))
	}
	return nil
}

// remove gives guest memory [off, off+size) back, as the balloon does.
func (p *fcPeer) remove(off, size int) error {
	if err := unix.Madvise(p.mem[off:off+size], unix.MADV_DONTNEED); err != nil {
		return fmt.Errorf("madvise dontneed: %w", err)
	}
	return nil
}

func (p *fcPeer) close() {
	if p.uffd >= 0 {
		unix.Close(p.uffd)
	}
	unix.Munmap(p.mem)
}
