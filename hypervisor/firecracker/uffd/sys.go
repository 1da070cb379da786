package uffd

import (
	"encoding/binary"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The userfaultfd kernel ABI (linux/userfaultfd.h). golang.org/x/sys has
// only the syscall number, so the few structs and ioctls used here are
// declared by hand; sizes are checked in sys_test.go and the
// side Firecracker plays (UFFDIO_API, UFFDIO_REGISTER) lives in uffdpeer.

const (
	uffdAPI = 0xAA // UFFD_API, also the ioctl type of every UFFDIO_* request

	eventPagefault = 0x12 // UFFD_EVENT_PAGEFAULT
	eventFork      = 0x13 // UFFD_EVENT_FORK
	eventRemove    = 0x15 // UFFD_EVENT_REMOVE

	msgSize = 32 // sizeof(struct uffd_msg), packed
)

// ioctl request numbers the handler issues: _IOWR/_IOR(UFFDIO, nr, struct).
var (
	ioctlWake     = ioc(2, 0x02, unsafe.Sizeof(rangeArg{}))
	ioctlCopy     = ioc(3, 0x03, unsafe.Sizeof(copyArg{}))
	ioctlZeropage = ioc(3, 0x04, unsafe.Sizeof(zeropageArg{}))
)

// ioc builds a Linux ioctl number; dir is 0 none, 1 write, 2 read, 3 both.
func ioc(dir, nr, size uintptr) uintptr {
	return dir<<30 | size<<16 | uffdAPI<<8 | nr
}

type rangeArg struct {
	Start uint64
	Len   uint64
}

type copyArg struct {
	Dst  uint64
	Src  uint64
	Len  uint64
	Mode uint64
	Copy int64
}

type zeropageArg struct {
	Range    rangeArg
	Mode     uint64
	Zeropage int64
}

// message is the part of a struct uffd_msg the handler uses. For a page
// fault A is the faulting address; for a remove [A, B) is the removed
// range; for a fork A's low 32 bits are the child's new userfaultfd.
type message struct {
	Event uint8
	A, B  uint64
}

// decodeMessage decodes one 32-byte struct uffd_msg: event at byte 0, the
// union from byte 8 (pagefault: flags, address; remove: start, end).
func decodeMessage(b []byte) message {
	m := message{Event: b[0]}
	switch m.Event {
	case eventPagefault:
		m.A = binary.NativeEndian.Uint64(b[16:24])
	case eventRemove:
		m.A = binary.NativeEndian.Uint64(b[8:16])
		m.B = binary.NativeEndian.Uint64(b[16:24])
	case eventFork:
		m.A = uint64(binary.NativeEndian.Uint32(b[8:12]))
	}
	return m
}

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	if errno != 0 {
		return errno
	}
	return nil
}

// copyPage resolves a missing fault at dst with size bytes read from src.
func copyPage(fd int, dst, src, size uint64) error {
	arg := copyArg{Dst: dst, Src: src, Len: size}
	return ioctl(fd, ioctlCopy, unsafe.Pointer(&arg))
}

// zeroPage resolves a missing fault at dst by mapping the zero page.
func zeroPage(fd int, dst, size uint64) error {
	arg := zeropageArg{Range: rangeArg{Start: dst, Len: size}}
	return ioctl(fd, ioctlZeropage, unsafe.Pointer(&arg))
}

// wake wakes threads waiting on [start, start+size), which another fault's
// resolution already filled.
func wake(fd int, start, size uint64) error {
	arg := rangeArg{Start: start, Len: size}
	return ioctl(fd, ioctlWake, unsafe.Pointer(&arg))
}
