// Package uffdpeer plays Firecracker's side of the userfaultfd handshake,
// for the page-fault handler's tests and the fake Firecracker: anonymous
// guest memory registered MISSING with a userfaultfd, which goes to the
// handler with the region list.
//
// Guest memory is only ever touched through process_vm_readv/writev, never
// by a load from Go code: the fault then happens in the kernel on behalf of
// a syscall, as KVM's accesses to guest memory do, and the goroutine
// waiting for it is in a syscall the Go scheduler knows about rather than
// stuck on a load.
package uffdpeer

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The half of the userfaultfd ABI (linux/userfaultfd.h) that Firecracker,
// not its handler, uses.
const (
	uffdAPI = 0xAA // UFFD_API, also the ioctl type of every UFFDIO_* request

	// FeatureEventRemove (UFFD_FEATURE_EVENT_REMOVE) makes the kernel
	// report MADV_DONTNEED of registered memory to the handler.
	FeatureEventRemove  = 1 << 3
	registerModeMissing = 1 << 0 // UFFDIO_REGISTER_MODE_MISSING
)

var (
	ioctlAPI      = ioc(3, 0x3F, unsafe.Sizeof(apiArg{}))
	ioctlRegister = ioc(3, 0x00, unsafe.Sizeof(registerArg{}))
	ioctlDevNewFD = ioc(0, 0x00, 0) // USERFAULTFD_IOC_NEW on /dev/userfaultfd
)

// ioc builds a Linux ioctl number; dir is 0 none, 1 write, 2 read, 3 both.
func ioc(dir, nr, size uintptr) uintptr { return dir<<30 | size<<16 | uffdAPI<<8 | nr }

type apiArg struct{ API, Features, Ioctls uint64 }

type registerArg struct{ Start, Len, Mode, Ioctls uint64 }

// Mapping is Firecracker's GuestRegionUffdMapping as it sends it. The
// handler decodes it as uffd.Mapping; this package cannot use that type,
// since the uffd package's own tests import this one.
type Mapping struct {
	BaseHostVirtAddr uint64 `json:"base_host_virt_addr"`
	Size             uint64 `json:"size"`
	Offset           uint64 `json:"offset"`
	PageSize         uint64 `json:"page_size"`
}

// Peer is Firecracker's guest memory and the userfaultfd it is registered
// with.
type Peer struct {
	mem  []byte
	uffd int
}

// New maps size bytes of guest memory and registers it with a new
// userfaultfd that asked for features.
func New(size int, features uint64) (*Peer, error) {
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("map guest memory: %w", err)
	}
	p := &Peer{mem: mem, uffd: -1}
	if err := p.register(features); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

func (p *Peer) register(features uint64) error {
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
	reg := registerArg{Start: p.base(), Len: uint64(len(p.mem)), Mode: registerModeMissing}
	if err := ioctl(p.uffd, ioctlRegister, unsafe.Pointer(&reg)); err != nil {
		return fmt.Errorf("UFFDIO_REGISTER: %w", err)
	}
	return nil
}

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg)); errno != 0 {
		return errno
	}
	return nil
}

func (p *Peer) base() uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(p.mem)))) }

// Size is the guest memory's size in bytes.
func (p *Peer) Size() int { return len(p.mem) }

// Mapping describes guest memory [off, off+size) as backed by the memory
// file from fileOff.
func (p *Peer) Mapping(off, size, fileOff uint64) Mapping {
	return Mapping{BaseHostVirtAddr: p.base() + off, Size: size, Offset: fileOff, PageSize: uint64(os.Getpagesize())}
}

// Send performs Firecracker's handshake with the handler listening on
// sock: the region list as JSON, the userfaultfd in SCM_RIGHTS.
func (p *Peer) Send(sock string, ms ...Mapping) error {
	payload, err := json.Marshal(ms)
	if err != nil {
		return fmt.Errorf("encode region list: %w", err)
	}
	return Handshake(sock, payload, p.uffd)
}

// Handshake connects to sock and sends payload with fds attached, however
// malformed; a nil payload hangs up without sending.
func Handshake(sock string, payload []byte, fds ...int) error {
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

// Read copies guest memory at off into buf, faulting it in as KVM would.
func (p *Peer) Read(off int, buf []byte) error {
	n, err := unix.ProcessVMReadv(os.Getpid(), localIovec(buf), p.remoteIovec(off, len(buf)), 0)
	return checkTransfer("read", off, n, len(buf), err)
}

// Write stores data into guest memory at off, faulting it in as KVM would.
func (p *Peer) Write(off int, data []byte) error {
	n, err := unix.ProcessVMWritev(os.Getpid(), localIovec(data), p.remoteIovec(off, len(data)), 0)
	return checkTransfer("write", off, n, len(data), err)
}

func localIovec(b []byte) []unix.Iovec {
	iov := []unix.Iovec{{Base: &b[0]}}
	iov[0].SetLen(len(b))
	return iov
}

func (p *Peer) remoteIovec(off, n int) []unix.RemoteIovec {
	return []unix.RemoteIovec{{Base: uintptr(p.base()) + uintptr(off), Len: n}}
}

func checkTransfer(verb string, off, n, want int, err error) error {
	if err != nil {
		return fmt.Errorf("%s guest memory at %#x: %w", verb, off, err)
	}
	if n != want {
		return fmt.Errorf("%s guest memory at %#x: %d of %d bytes", verb, off, n, want)
	}
	return nil
}

// Remove gives guest memory [off, off+size) back, as the balloon does.
func (p *Peer) Remove(off, size int) error {
	if err := unix.Madvise(p.mem[off:off+size], unix.MADV_DONTNEED); err != nil {
		return fmt.Errorf("madvise dontneed: %w", err)
	}
	return nil
}

// CloseUFFD closes the peer's userfaultfd but keeps its guest memory. Once
// the handler holds its own copy, this leaves the handler the only owner of
// the userfaultfd: should it go away, faults fall back to zero pages
// instead of blocking forever.
func (p *Peer) CloseUFFD() {
	if p.uffd >= 0 {
		unix.Close(p.uffd)
		p.uffd = -1
	}
}

// Close closes the userfaultfd and unmaps guest memory.
func (p *Peer) Close() {
	p.CloseUFFD()
	unix.Munmap(p.mem)
}
