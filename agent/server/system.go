package server

import (
	"fmt"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// System is what the agent changes on the machine; tests replace it so they
// never touch the host's clock, entropy pool, name or power.
type System interface {
	KernelRelease() string
	SetTime(t time.Time) error
	AddEntropy(b []byte) error // credit b to the pool and reseed the CRNG
	SetHostname(name string) error
	SetSysctl(key, value string) error // key as OCI's linux.sysctl names it
	Sync()
	PowerOff() error
}

// Linux is the System of the guest the agent runs in.
type Linux struct{}

// KernelRelease is uname -r.
func (Linux) KernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// SetTime sets the wall clock.
func (Linux) SetTime(t time.Time) error {
	ts := unix.NsecToTimespec(t.UnixNano())
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return fmt.Errorf("set guest clock: %w", err)
	}
	return nil
}

// AddEntropy mixes b into the input pool, credits it (RNDADDENTROPY) and
// reseeds the CRNG from it (RNDRESEEDCRNG), so clones of one snapshot stop
// sharing random state at once.
func (Linux) AddEntropy(b []byte) error {
	fd, err := unix.Open("/dev/random", unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open /dev/random: %w", err)
	}
	defer unix.Close(fd)
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	info := make([]byte, 8+len(b)+3)
	*(*int32)(unsafe.Pointer(&info[0])) = int32(len(b) * 8)
	*(*int32)(unsafe.Pointer(&info[4])) = int32(len(b))
	copy(info[8:], b)
	if err := ioctlPtr(fd, unix.RNDADDENTROPY, unsafe.Pointer(&info[0])); err != nil {
		return fmt.Errorf("add entropy: %w", err)
	}
	if err := ioctlPtr(fd, unix.RNDRESEEDCRNG, nil); err != nil {
		return fmt.Errorf("reseed crng: %w", err)
	}
	return nil
}

func ioctlPtr(fd int, req uint, arg unsafe.Pointer) error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg))
	if errno != 0 {
		return errno
	}
	return nil
}

// SetHostname sets the guest's host name.
func (Linux) SetHostname(name string) error {
	if err := unix.Sethostname([]byte(name)); err != nil {
		return fmt.Errorf("set hostname %q: %w", name, err)
	}
	return nil
}

// Sync flushes every file system.
func (Linux) Sync() { unix.Sync() }

// PowerOff turns the VM off.
func (Linux) PowerOff() error {
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		return fmt.Errorf("power off: %w", err)
	}
	return nil
}
