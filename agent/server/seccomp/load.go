package seccomp

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Load installs f on the calling thread, which passes it on to what it
// forks; the caller keeps its goroutine locked to the thread for good (the
// thread must die with it). Without no_new_privs the thread needs
// CAP_SYS_ADMIN.
func (f *Filter) Load() error {
	insts, flags := f.Program()
	prog := unix.SockFprog{Len: uint16(len(insts)), Filter: &insts[0]}
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, flags, uintptr(unsafe.Pointer(&prog))); e != 0 {
		return fmt.Errorf("load seccomp filter: %w", e)
	}
	return nil
}

// Program is f as the kernel loads it, with its SECCOMP_FILTER_FLAG_*s,
// for a process that loads it itself (agent/cinit).
func (f *Filter) Program() ([]unix.SockFilter, uintptr) {
	insts := make([]unix.SockFilter, len(f.prog))
	for i, in := range f.prog {
		insts[i] = unix.SockFilter{Code: in.Op, Jt: in.Jt, Jf: in.Jf, K: in.K}
	}
	return insts, f.flags
}

// Call is a system call as a filter sees it.
type Call struct {
	Arch uint32 // AUDIT_ARCH_*; 0 is this machine's
	Nr   uint32
	Args [maxArgs]uint64
}

// NativeCall is the call named name on this machine's architecture, with
// args; false when the architecture has no such call.
func NativeCall(name string, args ...uint64) (Call, bool) {
	nat, table, err := native()
	if err != nil {
		return Call{}, false
	}
	nr, ok := table[nat].info.SyscallNames[name]
	if !ok {
		return Call{}, false
	}
	c := Call{Nr: uint32(nr)}
	copy(c.Args[:], args)
	return c, true
}

// Returns runs f on c, as the kernel would, and says what f returns: a
// SECCOMP_RET_* action, with its data.
func (f *Filter) Returns(c Call) (uint32, error) {
	vm, err := f.machine()
	if err != nil {
		return 0, err
	}
	return run(vm, c)
}

// Refuses is the index of the first of calls that f does not let
// through (allow, or allow and log), or -1 when it lets them all.
func (f *Filter) Refuses(calls []Call) (int, error) {
	vm, err := f.machine()
	if err != nil {
		return 0, err
	}
	for i, c := range calls {
		ret, err := run(vm, c)
		if err != nil {
			return i, err
		}
		if ret != unix.SECCOMP_RET_ALLOW && ret != unix.SECCOMP_RET_LOG {
			return i, nil
		}
	}
	return -1, nil
}

func (f *Filter) machine() (*bpf.VM, error) {
	vm, err := bpf.NewVM(f.insts)
	if err != nil {
		return nil, fmt.Errorf("load seccomp filter into a BPF machine: %w", err)
	}
	return vm, nil
}

// run runs the filter in vm on c.
func run(vm *bpf.VM, c Call) (uint32, error) {
	if c.Arch == 0 {
		nat, table, err := native()
		if err != nil {
			return 0, err
		}
		c.Arch = uint32(table[nat].info.ID)
	}
	// x/net/bpf loads words big-endian, as from a packet: each 32-bit word
	// goes in that way to be read as the kernel reads it natively.
	data := make([]byte, offArgs+8*maxArgs)
	binary.BigEndian.PutUint32(data[offNr:], c.Nr)
	binary.BigEndian.PutUint32(data[offArch:], c.Arch)
	for i, a := range c.Args {
		binary.BigEndian.PutUint32(data[offArgs+8*i:], uint32(a))
		binary.BigEndian.PutUint32(data[offArgs+8*i+4:], uint32(a>>32))
	}
	ret, err := vm.Run(data)
	if err != nil {
		return 0, fmt.Errorf("run seccomp filter: %w", err)
	}
	return uint32(ret), nil
}
