package apifake

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The part of the userfaultfd ABI (linux/userfaultfd.h) that Firecracker,
// not its page-fault handler, uses.
const (
	uffdAPI             = 0xAA
	uffdFeatureRemove   = 1 << 3 // UFFD_FEATURE_EVENT_REMOVE
	registerModeMissing = 1 << 0 // UFFDIO_REGISTER_MODE_MISSING
)

type uffdAPIArg struct{ API, Features, Ioctls uint64 }

type uffdRegisterArg struct{ Start, Len, Mode, Ioctls uint64 }

var (
	ioctlUffdAPI      = ioc(3, 0x3F, unsafe.Sizeof(uffdAPIArg{}))
	ioctlUffdRegister = ioc(3, 0x00, unsafe.Sizeof(uffdRegisterArg{}))
	ioctlUffdNewFD    = ioc(0, 0x00, 0) // USERFAULTFD_IOC_NEW on /dev/userfaultfd
)

func ioc(dir, nr, size uintptr) uintptr { return dir<<30 | size<<16 | uffdAPI<<8 | nr }

// uffdMapping is Firecracker's GuestRegionUffdMapping.
type uffdMapping struct {
	BaseHostVirtAddr uint64 `json:"base_host_virt_addr"`
	Size             uint64 `json:"size"`
	Offset           uint64 `json:"offset"`
	PageSize         uint64 `json:"page_size"`
}

// uffdMemory plays Firecracker's Uffd backend: size bytes of anonymous
// guest memory registered with a userfaultfd, which goes to the handler
// listening on sock with the region list, as Firecracker sends it. Every
// page the fake later reads is then a fault the handler must serve.
func uffdMemory(sock string, size int) (*guestMemory, error) {
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("map guest memory: %w", err)
	}
	fd, err := registerUffd(mem)
	if err != nil {
		unix.Munmap(mem)
		return nil, err
	}
	defer unix.Close(fd)
	base := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(mem))))
	payload, _ := json.Marshal([]uffdMapping{{BaseHostVirtAddr: base, Size: uint64(size), PageSize: uint64(os.Getpagesize())}})
	conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		unix.Munmap(mem)
		return nil, fmt.Errorf("connect to uffd handler: %w", err)
	}
	defer conn.Close()
	if _, _, err := conn.WriteMsgUnix(payload, unix.UnixRights(fd), nil); err != nil {
		unix.Munmap(mem)
		return nil, fmt.Errorf("send uffd handshake: %w", err)
	}
	return &guestMemory{anon: mem}, nil
}

func registerUffd(mem []byte) (int, error) {
	dev, err := unix.Open("/dev/userfaultfd", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open /dev/userfaultfd: %w", err)
	}
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(dev), ioctlUffdNewFD, unix.O_CLOEXEC|unix.O_NONBLOCK)
	unix.Close(dev)
	if errno != 0 {
		return -1, fmt.Errorf("USERFAULTFD_IOC_NEW: %w", errno)
	}
	fd := int(r)
	api := uffdAPIArg{API: uffdAPI, Features: uffdFeatureRemove}
	reg := uffdRegisterArg{Start: uint64(uintptr(unsafe.Pointer(unsafe.SliceData(mem)))), Len: uint64(len(mem)), Mode: registerModeMissing}
	for _, op := range []struct {
		name string
		req  uintptr
		arg  unsafe.Pointer
	}{{"UFFDIO_API", ioctlUffdAPI, unsafe.Pointer(&api)}, {"UFFDIO_REGISTER", ioctlUffdRegister, unsafe.Pointer(&reg)}} {
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), op.req, uintptr(op.arg)); errno != 0 {
			unix.Close(fd)
			return -1, fmt.Errorf("%s: %w", op.name, errno)
		}
	}
	return fd, nil
}

// readAnon copies guest memory at off into buf through process_vm_readv,
// so a fault is taken inside the kernel on behalf of a syscall, as KVM's
// accesses are, rather than by a Go load stalling its thread.
func readAnon(mem []byte, off int, buf []byte) error {
	local := []unix.Iovec{{Base: &buf[0]}}
	local[0].SetLen(len(buf))
	remote := []unix.RemoteIovec{{Base: uintptr(unsafe.Pointer(&mem[off])), Len: len(buf)}}
	n, err := unix.ProcessVMReadv(os.Getpid(), local, remote, 0)
	if err != nil {
		return fmt.Errorf("read guest memory at %#x: %w", off, err)
	}
	if n != len(buf) {
		return fmt.Errorf("read guest memory at %#x: %d of %d bytes", off, n, len(buf))
	}
	return nil
}
