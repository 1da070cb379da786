package seccomp

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"

	ctrdseccomp "github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/elastic/go-seccomp-bpf/arch"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

const (
	allow = unix.SECCOMP_RET_ALLOW
	eperm = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	kill  = unix.SECCOMP_RET_KILL_THREAD
)

func requireAMD64(t *testing.T) {
	t.Helper()
	if runtime.GOARCH != "amd64" {
		t.Skipf("the syscall numbers here are x86_64's; this is %s", runtime.GOARCH)
	}
}

func nr(t *testing.T, a *arch.Info, name string) uint32 {
	t.Helper()
	n, ok := a.SyscallNames[name]
	if !ok {
		t.Fatalf("%s has no syscall %s", a.Name, name)
	}
	return uint32(n)
}

func compile(t *testing.T, s *specs.LinuxSeccomp) *Filter {
	t.Helper()
	f, err := Compile(s)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestContainerdDefault runs containerd's default profile (what CRI's
// RuntimeDefault and ctr's --seccomp give) on calls whose fate is known.
func TestContainerdDefault(t *testing.T) {
	requireAMD64(t)
	f := compile(t, ctrdseccomp.DefaultProfile(&specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{
		Bounding: []string{"CAP_CHOWN", "CAP_SETUID", "CAP_SETGID", "CAP_SYS_CHROOT", "CAP_KILL"},
	}}}))
	x64, i386 := arch.X86_64, arch.I386
	for _, tc := range []struct {
		name string
		call Call
		want uint32
	}{
		{"read", Call{Nr: nr(t, x64, "read")}, allow},
		{"mount", Call{Nr: nr(t, x64, "mount")}, eperm},
		{"unshare", Call{Nr: nr(t, x64, "unshare")}, eperm},
		{"clone of a thread", Call{Nr: nr(t, x64, "clone"), Args: [6]uint64{unix.CLONE_VM | unix.CLONE_THREAD}}, allow},
		{"clone into a new namespace", Call{Nr: nr(t, x64, "clone"), Args: [6]uint64{unix.CLONE_NEWNS}}, eperm},
		{"clone3", Call{Nr: nr(t, x64, "clone3")}, unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
		{"personality 0", Call{Nr: nr(t, x64, "personality"), Args: [6]uint64{0}}, allow},
		{"personality query", Call{Nr: nr(t, x64, "personality"), Args: [6]uint64{0xffffffff}}, allow},
		{"personality other", Call{Nr: nr(t, x64, "personality"), Args: [6]uint64{0x0040000}}, eperm},
		{"socket AF_INET", Call{Nr: nr(t, x64, "socket"), Args: [6]uint64{unix.AF_INET}}, allow},
		{"socket AF_VSOCK", Call{Nr: nr(t, x64, "socket"), Args: [6]uint64{unix.AF_VSOCK}}, eperm},
		{"socket AF_INET, high half set", Call{Nr: nr(t, x64, "socket"), Args: [6]uint64{1<<32 | unix.AF_INET}}, eperm},
		{"i386 read", Call{Arch: uint32(i386.ID), Nr: nr(t, i386, "read")}, allow},
		{"i386 mount", Call{Arch: uint32(i386.ID), Nr: nr(t, i386, "mount")}, eperm},
		{"x32 read", Call{Nr: nr(t, x64, "read") | x32Bit}, allow},
		{"another architecture", Call{Arch: unix.AUDIT_ARCH_AARCH64, Nr: 63}, kill},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := f.Returns(tc.call)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("returns %#x, want %#x", got, tc.want)
			}
		})
	}
}

// TestConditions checks each operator on both halves of a 64-bit
// argument, and runc's OR for an argument compared twice.
func TestConditions(t *testing.T) {
	requireAMD64(t)
	const v = 0x1_0000_0005
	read := nr(t, arch.X86_64, "read")
	for _, tc := range []struct {
		op    specs.LinuxSeccompOperator
		two   uint64
		allow []uint64
		deny  []uint64
	}{
		{specs.OpEqualTo, 0, []uint64{v}, []uint64{5, v + 1, 1 << 32}},
		{specs.OpNotEqual, 0, []uint64{5, v + 1, 1 << 32}, []uint64{v}},
		{specs.OpGreaterThan, 0, []uint64{v + 1, 2 << 32}, []uint64{v, 6, 1<<32 | 4}},
		{specs.OpGreaterEqual, 0, []uint64{v, 2 << 32}, []uint64{v - 1, 6}},
		{specs.OpLessThan, 0, []uint64{v - 1, 6, 0}, []uint64{v, 2 << 32, 1<<32 | 6}},
		{specs.OpLessEqual, 0, []uint64{v, 6}, []uint64{v + 1, 2 << 32}},
		{specs.OpMaskedEqual, 1<<32 | 4, []uint64{1<<32 | 4, 1<<32 | 6, 3<<32 | 4}, []uint64{5, 1 << 32, 4, v}},
	} {
		t.Run(string(tc.op), func(t *testing.T) {
			f := compile(t, &specs.LinuxSeccomp{DefaultAction: specs.ActErrno, Syscalls: []specs.LinuxSyscall{{
				Names: []string{"read"}, Action: specs.ActAllow,
				Args: []specs.LinuxSeccompArg{{Index: 2, Value: v, ValueTwo: tc.two, Op: tc.op}},
			}}})
			for _, want := range []struct {
				args []uint64
				ret  uint32
			}{{tc.allow, allow}, {tc.deny, eperm}} {
				for _, a := range want.args {
					if got, err := f.Returns(Call{Nr: read, Args: [6]uint64{2: a}}); err != nil || got != want.ret {
						t.Errorf("read with arg2 %#x: %#x (%v), want %#x", a, got, err, want.ret)
					}
				}
			}
		})
	}
	t.Run("same argument twice is OR", func(t *testing.T) {
		f := compile(t, &specs.LinuxSeccomp{DefaultAction: specs.ActErrno, Syscalls: []specs.LinuxSyscall{{
			Names: []string{"read"}, Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{Index: 0, Value: 1, Op: specs.OpEqualTo}, {Index: 0, Value: 2, Op: specs.OpEqualTo}},
		}}})
		for a, want := range map[uint64]uint32{1: allow, 2: allow, 3: eperm} {
			if got, _ := f.Returns(Call{Nr: read, Args: [6]uint64{a}}); got != want {
				t.Errorf("read(%d): %#x, want %#x", a, got, want)
			}
		}
	})
	t.Run("different arguments are AND", func(t *testing.T) {
		f := compile(t, &specs.LinuxSeccomp{DefaultAction: specs.ActErrno, Syscalls: []specs.LinuxSyscall{{
			Names: []string{"read"}, Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{Index: 0, Value: 1, Op: specs.OpEqualTo}, {Index: 1, Value: 2, Op: specs.OpEqualTo}},
		}}})
		for args, want := range map[[2]uint64]uint32{{1, 2}: allow, {1, 3}: eperm, {0, 2}: eperm} {
			if got, _ := f.Returns(Call{Nr: read, Args: [6]uint64{args[0], args[1]}}); got != want {
				t.Errorf("read%v: %#x, want %#x", args, got, want)
			}
		}
	})
}

// TestFirstRuleDecides: rules match in the profile's order, and actions
// carry their errno.
func TestFirstRuleDecides(t *testing.T) {
	requireAMD64(t)
	nine := uint(9)
	f := compile(t, &specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{
		{Names: []string{"getppid", "getpid"}, Action: specs.ActErrno, ErrnoRet: &nine},
		{Names: []string{"getpid", "gettid"}, Action: specs.ActKillProcess},
		{Names: []string{"no_such_call"}, Action: specs.ActKill},
	}})
	for name, want := range map[string]uint32{
		"getppid": unix.SECCOMP_RET_ERRNO | 9, "getpid": unix.SECCOMP_RET_ERRNO | 9,
		"gettid": unix.SECCOMP_RET_KILL_PROCESS, "read": allow,
	} {
		if got, _ := f.Returns(Call{Nr: nr(t, arch.X86_64, name)}); got != want {
			t.Errorf("%s: %#x, want %#x", name, got, want)
		}
	}
}

// TestCompileRefuses: what cannot be applied is an error naming it.
func TestCompileRefuses(t *testing.T) {
	big := uint(1 << 16)
	ok := specs.LinuxSyscall{Names: []string{"read"}, Action: specs.ActAllow}
	for _, tc := range []struct {
		name string
		s    specs.LinuxSeccomp
		want string
	}{
		{"unknown default action", specs.LinuxSeccomp{DefaultAction: "SCMP_ACT_MAYBE"}, "SCMP_ACT_MAYBE"},
		{"notify", specs.LinuxSeccomp{DefaultAction: specs.ActAllow, ListenerPath: "/run/agent.sock"}, "notify"},
		{"notify action", specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{{Names: []string{"read"}, Action: specs.ActNotify}}}, "SCMP_ACT_NOTIFY"},
		{"unknown architecture", specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Architectures: []specs.Arch{"SCMP_ARCH_VAX"}}, "SCMP_ARCH_VAX"},
		{"unknown flag", specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Flags: []specs.LinuxSeccompFlag{"SECCOMP_FILTER_FLAG_MAGIC"}}, "SECCOMP_FILTER_FLAG_MAGIC"},
		{"argument 6", specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{{Names: []string{"read"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 6, Op: specs.OpEqualTo}}}}}, "index 6"},
		{"unknown operator", specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{{Names: []string{"read"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Op: "SCMP_CMP_ABOUT"}}}}}, "SCMP_CMP_ABOUT"},
		{"errno out of range", specs.LinuxSeccomp{DefaultAction: specs.ActErrno, DefaultErrnoRet: &big, Syscalls: []specs.LinuxSyscall{ok}}, "65536"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Compile(&tc.s)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Compile: %v, want an error naming %q", err, tc.want)
			}
		})
	}
	if _, err := Compile(&specs.LinuxSeccomp{DefaultAction: specs.ActAllow, ListenerPath: "/x"}); !errors.Is(err, ErrUnsupported) {
		t.Errorf("notify: %v, want ErrUnsupported", err)
	}
}

// TestLoad installs filters on threads of their own: the kernel takes the
// program (containerd's default too), the thread reports the filter, a
// call it refuses fails there with the profile's errno, and the process's
// other threads are not filtered.
func TestLoad(t *testing.T) {
	requireAMD64(t)
	for _, tc := range []struct {
		name    string
		s       *specs.LinuxSeccomp
		refused uintptr
	}{
		{"one rule", &specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{
			{Names: []string{"getppid"}, Action: specs.ActErrno},
		}}, unix.SYS_GETPPID},
		{"containerd's default", ctrdseccomp.DefaultProfile(&specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{}}}), unix.SYS_UNSHARE},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := compile(t, tc.s)
			done := make(chan error)
			go func() { done <- loadAndCall(f, tc.refused) }()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if _, _, e := unix.RawSyscall(tc.refused, 0, 0, 0); e == unix.EPERM {
				t.Error("another thread of the process is filtered too")
			}
		})
	}
}

// loadAndCall loads f on a thread that ends with it, and checks that the
// thread has it and that f refuses call there.
func loadAndCall(f *Filter, call uintptr) error {
	runtime.LockOSThread() // never unlocked: the thread ends with the filter
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return err
	}
	if err := f.Load(); err != nil {
		return err
	}
	status, err := os.ReadFile("/proc/thread-self/status")
	if err != nil {
		return err
	}
	if !strings.Contains(string(status), "Seccomp:\t2") {
		return errors.New("the thread reports no filter")
	}
	if _, _, e := unix.RawSyscall(call, 0, 0, 0); e != unix.EPERM {
		return fmt.Errorf("call %d was not refused with EPERM: %v", call, e)
	}
	return nil
}
