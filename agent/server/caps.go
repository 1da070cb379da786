package server

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// capNames are the capabilities by number, as the OCI spec names them.
var capNames = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE",
	"CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE",
	"CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT",
	"CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
	"CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG",
	"CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
}

// lastCap is the highest capability the guest's kernel knows.
var lastCap = sync.OnceValue(func() int {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n < 64 {
			return n
		}
	}
	return len(capNames) - 1
})

// capSet is a process's capabilities, each set a bit per capability.
type capSet struct {
	bounding, inheritable, ambient uint64
}

// newCapSet reads c, refusing a name the guest's kernel does not know; nil
// c (the agent's own) and a bounding set of every capability are nil: the
// process keeps what the agent has.
func newCapSet(c *api.Capabilities) (*capSet, error) {
	if c == nil {
		return nil, nil
	}
	var s capSet
	for _, set := range []struct {
		names []string
		bits  *uint64
	}{{c.Bounding, &s.bounding}, {c.Inheritable, &s.inheritable}, {c.Ambient, &s.ambient}} {
		for _, name := range set.names {
			n := capNumber(name)
			if n < 0 || n > lastCap() {
				return nil, fmt.Errorf("capability %q: the guest's kernel knows %s to %s: %w", name, capNames[0], capNames[lastCap()], errdefs.ErrInvalidArgument)
			}
			*set.bits |= 1 << n
		}
	}
	if s.bounding == 1<<(lastCap()+1)-1 && s.inheritable == 0 && s.ambient == 0 {
		return nil, nil
	}
	return &s, nil
}

func capNumber(name string) int {
	for i, n := range capNames {
		if n == name {
			return i
		}
	}
	return -1
}

// take gives this thread the set, for the process it forks next: its
// bounding set (which, for a process that stays root, is what it gets at
// exec) and inheritable set, with the ambient ones among them (Go raises
// those in the child). Its own effective set, which the fork's setuid and
// chroot need, stays.
func (s *capSet) take() error {
	for i := 0; i <= lastCap(); i++ {
		if s.bounding&(1<<i) == 0 {
			if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(i), 0, 0, 0); err != nil {
				return fmt.Errorf("drop %s from the bounding set: %w", capNames[i], err)
			}
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("read capabilities: %w", err)
	}
	inh := s.inheritable | s.ambient
	data[0].Inheritable, data[1].Inheritable = uint32(inh), uint32(inh>>32)
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("set inheritable capabilities: %w", err)
	}
	return nil
}

// ambientList is the ambient set as Go's SysProcAttr takes it.
func (s *capSet) ambientList() []uintptr {
	var out []uintptr
	for i := 0; i < 64; i++ {
		if s.ambient&(1<<i) != 0 {
			out = append(out, uintptr(i))
		}
	}
	return out
}
