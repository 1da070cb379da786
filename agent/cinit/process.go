package cinit

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"github.com/moby/sys/capability"
	"golang.org/x/sys/unix"
)

// confine gives the process what it runs with, in runc's order: rlimits
// and its OOM score while the helper is root, the filter now when it
// needs CAP_SYS_ADMIN to load (no no_new_privileges), the bounding set,
// the user (keeping the capabilities across the change), the other sets,
// no_new_privileges, the umask and cwd; then the program is looked up as
// the user, and its path returned.
func (p *Process) confine() (string, error) {
	for _, l := range p.Rlimits {
		if err := unix.Prlimit(0, l.Resource, &unix.Rlimit{Cur: l.Soft, Max: l.Hard}, nil); err != nil {
			return "", fmt.Errorf("set rlimit %d to %d/%d: %w", l.Resource, l.Soft, l.Hard, err)
		}
	}
	if p.OOMScoreAdj != nil {
		if err := os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(*p.OOMScoreAdj)), 0); err != nil {
			return "", fmt.Errorf("set oom_score_adj: %w", err)
		}
	}
	if p.Seccomp != nil && !p.NoNewPrivileges {
		if err := p.Seccomp.load(); err != nil {
			return "", err
		}
	}
	if err := p.takeUser(); err != nil {
		return "", err
	}
	if p.NoNewPrivileges {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return "", fmt.Errorf("set no_new_privileges: %w", err)
		}
	}
	if p.Umask != nil {
		unix.Umask(int(*p.Umask))
	}
	if err := unix.Chdir(p.Cwd); err != nil {
		return "", fmt.Errorf("enter cwd %s: %w", p.Cwd, err)
	}
	return p.lookPath()
}

// takeUser drops the bounding set, becomes the process's user keeping
// its permitted capabilities, then sets the process's sets.
func (p *Process) takeUser() error {
	var caps capability.Capabilities
	if p.Caps != nil {
		var err error
		if caps, err = capability.NewPid2(0); err == nil {
			err = caps.Load()
		}
		if err != nil {
			return fmt.Errorf("read capabilities: %w", err)
		}
		caps.Clear(capability.BOUNDS)
		caps.Set(capability.BOUNDING, capsOf(p.Caps.Bounding)...)
		if err := caps.Apply(capability.BOUNDS); err != nil {
			return fmt.Errorf("set the bounding set: %w", err)
		}
		if err := unix.Prctl(unix.PR_SET_KEEPCAPS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("keep capabilities: %w", err)
		}
	}
	if err := setUser(p.UID, p.GID, p.Groups); err != nil {
		return err
	}
	if p.Caps == nil {
		return nil
	}
	caps.Clear(capability.CAPS | capability.AMBS)
	caps.Set(capability.EFFECTIVE, capsOf(p.Caps.Effective)...)
	caps.Set(capability.PERMITTED, capsOf(p.Caps.Permitted)...)
	caps.Set(capability.INHERITABLE, capsOf(p.Caps.Inheritable)...)
	caps.Set(capability.AMBIENT, capsOf(p.Caps.Ambient)...)
	if err := caps.Apply(capability.CAPS | capability.AMBS); err != nil {
		return fmt.Errorf("set capabilities: %w", err)
	}
	return nil
}

// setUser sets the groups and ids of every thread (Go's calls do all).
func setUser(uid, gid uint32, groups []uint32) error {
	gids := make([]int, len(groups))
	for i, g := range groups {
		gids[i] = int(g)
	}
	if err := syscall.Setgroups(gids); err != nil {
		return fmt.Errorf("set groups %v: %w", groups, err)
	}
	if err := syscall.Setresgid(int(gid), int(gid), int(gid)); err != nil {
		return fmt.Errorf("set gid %d: %w", gid, err)
	}
	if err := syscall.Setresuid(int(uid), int(uid), int(uid)); err != nil {
		return fmt.Errorf("set uid %d: %w", uid, err)
	}
	return nil
}

func capsOf(ns []int) []capability.Cap {
	out := make([]capability.Cap, len(ns))
	for i, n := range ns {
		out[i] = capability.Cap(n)
	}
	return out
}

// load installs the filter on this thread, which the exec keeps.
func (s *Seccomp) load() error {
	if len(s.Program) == 0 {
		return errors.New("load seccomp filter: empty program")
	}
	prog := unix.SockFprog{Len: uint16(len(s.Program)), Filter: &s.Program[0]}
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, s.Flags, uintptr(unsafe.Pointer(&prog))); e != 0 {
		return fmt.Errorf("load seccomp filter: %w", e)
	}
	return nil
}

// exec runs the program: the filter goes on last when no_new_privileges
// lets it load without privileges.
func (p *Process) exec(path string) error {
	if p.Seccomp != nil && p.NoNewPrivileges {
		if err := p.Seccomp.load(); err != nil {
			return err
		}
	}
	err := syscall.Exec(path, p.Args, p.Env)
	return fmt.Errorf("exec %s: %w", path, err)
}

// lookPath finds Args[0] as execvp would, with the process's PATH.
func (p *Process) lookPath() (string, error) {
	prog := p.Args[0]
	if strings.Contains(prog, "/") {
		return prog, executable(prog)
	}
	for _, dir := range filepath.SplitList(getenv(p.Env, "PATH")) {
		if dir == "" {
			dir = "."
		}
		if c := filepath.Join(dir, prog); executable(c) == nil {
			return c, nil
		}
	}
	return "", fmt.Errorf("exec: %q: executable file not found in $PATH", prog)
}

func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("exec: %q: %w", p, err)
	}
	if fi.IsDir() {
		return fmt.Errorf("exec: %q: is a directory", p)
	}
	if err := unix.Access(p, unix.X_OK); err != nil {
		return fmt.Errorf("exec: %q: %w", p, &fs.PathError{Op: "access", Path: p, Err: err})
	}
	return nil
}

func getenv(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v
		}
	}
	return ""
}
