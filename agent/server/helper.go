package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

const (
	// execHelperName is argv[0] of the agent re-executed as its exec helper.
	execHelperName = "cocoon-agent-exec"
	// helperErrFD is the helper's end of the pipe that carries why it
	// failed; exec closes it, which tells the agent the process runs.
	helperErrFD = 3
	// helperTimeout bounds the helper's setup, up to its exec.
	helperTimeout = 30 * time.Second
)

// helperReady says ExecHelper ran and returned: this binary can serve as
// the exec helper.
var helperReady atomic.Bool

// helperConfig is what the helper applies before it execs the process.
type helperConfig struct {
	Root            string   `json:"root,omitempty"`
	Cwd             string   `json:"cwd"`
	UID             uint32   `json:"uid"`
	GID             uint32   `json:"gid"`
	Groups          []uint32 `json:"groups,omitempty"`
	Rlimits         []rlimit `json:"rlimits,omitempty"`
	Umask           *uint32  `json:"umask,omitempty"`
	NoNewPrivileges bool     `json:"noNewPrivileges,omitempty"`
}

// ExecHelper must run first in main of a binary that serves the agent API,
// and in TestMain of tests that start processes with rlimits, a umask or
// no_new_privileges through it. When the binary was started as the agent's
// exec helper, it sets those up for the process only and execs it, never
// returning; otherwise it returns at once.
//
// Go cannot run code between fork and exec, and rlimits, the umask and
// no_new_privileges set in the agent would apply to the agent itself; so
// the agent re-executes itself as a helper that applies them and then
// execs the process, which keeps the helper's pid.
func ExecHelper() {
	if len(os.Args) < 3 || os.Args[0] != execHelperName {
		helperReady.Store(true)
		return
	}
	// Credentials and no_new_privileges are set on this thread, which
	// then execs: they become the process's.
	runtime.LockOSThread()
	err := runHelper(os.Args[1], os.Args[2:])
	_, _ = io.WriteString(os.NewFile(helperErrFD, "exec-error"), err.Error())
	os.Exit(127)
}

func runHelper(config string, argv []string) error {
	if _, err := unix.FcntlInt(helperErrFD, unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
		return fmt.Errorf("exec helper: %w", err)
	}
	var c helperConfig
	if err := json.Unmarshal([]byte(config), &c); err != nil {
		return fmt.Errorf("exec helper config: %w", err)
	}
	if c.Umask != nil {
		unix.Umask(int(*c.Umask))
	}
	for _, l := range c.Rlimits {
		// syscall's Setrlimit, so exec does not restore Go's own NOFILE.
		if err := syscall.Setrlimit(l.Resource, &syscall.Rlimit{Cur: l.Soft, Max: l.Hard}); err != nil {
			return fmt.Errorf("set %s to %d/%d: %w", l.Name, l.Soft, l.Hard, err)
		}
	}
	if c.Root != "" {
		if err := unix.Chroot(c.Root); err != nil {
			return fmt.Errorf("enter the container root: %w", err)
		}
	}
	if err := unix.Chdir(c.Cwd); err != nil {
		return fmt.Errorf("change to cwd %q: %w", c.Cwd, err)
	}
	if err := setThreadCredentials(c.UID, c.GID, c.Groups); err != nil {
		return err
	}
	if c.NoNewPrivileges {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("set no_new_privileges: %w", err)
		}
	}
	err := syscall.Exec(argv[0], argv[1:], os.Environ())
	return fmt.Errorf("exec %s: %w", argv[0], err)
}

// setThreadCredentials sets this thread's groups, gid and uid with raw
// system calls: the thread execs next, so they become the process's.
func setThreadCredentials(uid, gid uint32, groups []uint32) error {
	var list unsafe.Pointer
	if len(groups) > 0 {
		list = unsafe.Pointer(&groups[0])
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(groups)), uintptr(list), 0); e != 0 {
		return fmt.Errorf("set groups %v: %w", groups, e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(gid), uintptr(gid), uintptr(gid)); e != 0 {
		return fmt.Errorf("set gid %d: %w", gid, e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(uid), uintptr(uid), uintptr(uid)); e != 0 {
		return fmt.Errorf("set uid %d: %w", uid, e)
	}
	return nil
}

// needsHelper says whether the process needs what only the helper sets.
func (s *procSpec) needsHelper() bool {
	return len(s.rlimits) > 0 || s.umask != nil || s.noNewPrivileges
}

// command is the process to start: the program itself, chrooted by the
// fork, or the helper that sets up and then becomes it.
func (s *procSpec) command() (*exec.Cmd, error) {
	attr := &syscall.SysProcAttr{Setsid: true}
	if !s.needsHelper() {
		attr.Chroot = s.root
		attr.Credential = &syscall.Credential{Uid: s.uid, Gid: s.gid, Groups: s.gids}
		return &exec.Cmd{Path: s.path, Args: s.args, Env: s.env, Dir: s.cwd, SysProcAttr: attr}, nil
	}
	if !helperReady.Load() {
		return nil, fmt.Errorf("rlimits, a umask or no_new_privileges need the exec helper, which this binary does not run (server.ExecHelper): %w", errdefs.ErrNotImplemented)
	}
	config, err := json.Marshal(helperConfig{
		Root: s.root, Cwd: s.cwd, UID: s.uid, GID: s.gid, Groups: s.gids,
		Rlimits: s.rlimits, Umask: s.umask, NoNewPrivileges: s.noNewPrivileges,
	})
	if err != nil {
		return nil, fmt.Errorf("exec helper config: %w", err)
	}
	args := append([]string{execHelperName, string(config), s.path}, s.args...)
	return &exec.Cmd{Path: "/proc/self/exe", Args: args, Env: s.env, SysProcAttr: attr}, nil
}

// startHelper starts cmd, a helper, and returns once it exec'd the
// process, or with the reason it could not.
func startHelper(cmd *exec.Cmd) error {
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("create exec helper pipe: %w", err)
	}
	defer r.Close()
	cmd.ExtraFiles = []*os.File{w}
	err = cmd.Start()
	w.Close()
	if err != nil {
		return err
	}
	_ = r.SetReadDeadline(time.Now().Add(helperTimeout))
	msg, err := io.ReadAll(r)
	if err == nil && len(msg) == 0 {
		return nil
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("exec helper did not start the process within %v", helperTimeout)
	}
	if err != nil {
		return fmt.Errorf("read exec helper: %w", err)
	}
	return fmt.Errorf("%s: %w", msg, errdefs.ErrFailedPrecondition)
}
