// Package seccomp turns an OCI spec's linux.seccomp into the classic BPF
// program the kernel runs on every system call, as runc has libseccomp do,
// without cgo: the guest's agent is one static binary. The syscall tables
// are go-seccomp-bpf's (generated from the kernel's); x/net/bpf assembles
// and, for Allows, runs the program.
//
// It keeps runc's semantics where libseccomp's are subtle: a rule's
// conditions are ANDed unless one argument is compared twice, when each
// becomes a rule of its own (ORed); a syscall the table does not know is
// skipped; an architecture the profile does not list is killed (the
// thread), the native one always included; an errno action without
// errnoRet returns EPERM. One difference: rules are matched in the
// profile's order, the first deciding, where libseccomp orders them by
// action; profiles that give one syscall two actions are rare (and
// containerd's default has none).
package seccomp

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/elastic/go-seccomp-bpf/arch"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// ErrUnsupported marks a profile asking for what this package cannot do.
var ErrUnsupported = errors.New("not supported in the guest")

// Filter is a compiled profile, ready to load.
type Filter struct {
	insts []bpf.Instruction    // the program, to run in a BPF machine (Returns)
	prog  []bpf.RawInstruction // and assembled, to load
	flags uintptr              // SECCOMP_FILTER_FLAG_*
}

// Len is the program's length in instructions.
func (f *Filter) Len() int { return len(f.prog) }

// archOf is an OCI architecture's table, and the bit its syscall numbers
// carry (x32's).
type archOf struct {
	info *arch.Info
	bit  uint32
}

// native is this machine's architecture, and the compat ones a profile may
// list, by OCI name.
func native() (string, map[string]archOf, error) {
	switch runtime.GOARCH {
	case "amd64":
		return string(specs.ArchX86_64), map[string]archOf{
			string(specs.ArchX86_64): {info: arch.X86_64},
			string(specs.ArchX86):    {info: arch.I386},
			string(specs.ArchX32):    {info: arch.X86_64, bit: x32Bit}, // x32 numbers are x86_64's, flagged
		}, nil
	case "arm64":
		return string(specs.ArchAARCH64), map[string]archOf{
			string(specs.ArchAARCH64): {info: arch.AARCH64},
			string(specs.ArchARM):     {info: arch.ARM},
		}, nil
	}
	return "", nil, fmt.Errorf("seccomp on %s: %w", runtime.GOARCH, ErrUnsupported)
}

// knownArches are the OCI architecture names; listed ones that are not
// this machine's never match a system call, so they add nothing.
var knownArches = map[specs.Arch]bool{
	specs.ArchX86: true, specs.ArchX86_64: true, specs.ArchX32: true, specs.ArchARM: true,
	specs.ArchAARCH64: true, specs.ArchMIPS: true, specs.ArchMIPS64: true, specs.ArchMIPS64N32: true,
	specs.ArchMIPSEL: true, specs.ArchMIPSEL64: true, specs.ArchMIPSEL64N32: true, specs.ArchPPC: true,
	specs.ArchPPC64: true, specs.ArchPPC64LE: true, specs.ArchS390: true, specs.ArchS390X: true,
	specs.ArchPARISC: true, specs.ArchPARISC64: true, specs.ArchRISCV64: true,
}

// flagBits are the filter flags a profile may ask for.
var flagBits = map[specs.LinuxSeccompFlag]uintptr{
	specs.LinuxSeccompFlagLog:              unix.SECCOMP_FILTER_FLAG_LOG,
	specs.LinuxSeccompFlagSpecAllow:        unix.SECCOMP_FILTER_FLAG_SPEC_ALLOW,
	specs.LinuxSeccompFlagWaitKillableRecv: unix.SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV,
}

// Compile checks s and compiles it. An error names what in s is wrong or
// not supported.
func Compile(s *specs.LinuxSeccomp) (*Filter, error) {
	if s.ListenerPath != "" || s.DefaultAction == specs.ActNotify {
		return nil, fmt.Errorf("seccomp notify (listenerPath %q): %w", s.ListenerPath, ErrUnsupported)
	}
	def, err := action(s.DefaultAction, s.DefaultErrnoRet)
	if err != nil {
		return nil, fmt.Errorf("seccomp defaultAction: %w", err)
	}
	f := &Filter{}
	for _, fl := range s.Flags {
		bit, ok := flagBits[fl]
		if !ok {
			return nil, fmt.Errorf("seccomp flag %q: %w", fl, ErrUnsupported)
		}
		f.flags |= bit
	}
	arches, err := listedArches(s.Architectures)
	if err != nil {
		return nil, err
	}
	rules, err := compileRules(s.Syscalls)
	if err != nil {
		return nil, err
	}
	f.insts = program(arches, rules, def)
	prog, err := bpf.Assemble(f.insts)
	if err != nil {
		return nil, fmt.Errorf("assemble seccomp filter: %w", err)
	}
	if len(prog) > unix.BPF_MAXINSNS {
		return nil, fmt.Errorf("seccomp filter of %d instructions, more than the kernel's %d: %w", len(prog), unix.BPF_MAXINSNS, ErrUnsupported)
	}
	f.prog = prog
	return f, nil
}

// listedArches are the profile's architectures this machine runs, the
// native one first and always.
func listedArches(names []specs.Arch) ([]archOf, error) {
	nat, table, err := native()
	if err != nil {
		return nil, err
	}
	out := []archOf{table[nat]}
	for _, n := range names {
		if !knownArches[n] {
			return nil, fmt.Errorf("seccomp architecture %q: unknown", n)
		}
		if a, ok := table[string(n)]; ok && string(n) != nat {
			out = append(out, a)
		}
	}
	return out, nil
}

// action is the kernel's return value for an OCI action.
func action(a specs.LinuxSeccompAction, errnoRet *uint) (uint32, error) {
	data := uint32(unix.EPERM)
	if errnoRet != nil {
		if *errnoRet > unix.SECCOMP_RET_DATA {
			return 0, fmt.Errorf("errnoRet %d: more than %d", *errnoRet, unix.SECCOMP_RET_DATA)
		}
		data = uint32(*errnoRet)
	}
	switch a {
	case specs.ActKill, specs.ActKillThread:
		return unix.SECCOMP_RET_KILL_THREAD, nil
	case specs.ActKillProcess:
		return unix.SECCOMP_RET_KILL_PROCESS, nil
	case specs.ActTrap:
		return unix.SECCOMP_RET_TRAP, nil
	case specs.ActErrno:
		return unix.SECCOMP_RET_ERRNO | data, nil
	case specs.ActTrace:
		return unix.SECCOMP_RET_TRACE | data, nil
	case specs.ActAllow:
		return unix.SECCOMP_RET_ALLOW, nil
	case specs.ActLog:
		return unix.SECCOMP_RET_LOG, nil
	case specs.ActNotify:
		return 0, fmt.Errorf("action %s: %w", a, ErrUnsupported)
	}
	return 0, fmt.Errorf("action %q: unknown", a)
}
