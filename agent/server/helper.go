package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
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
	// helperCtlFD is the helper's end of its control socket.
	helperCtlFD = 3
	// helperTimeout bounds each step of the helper: its start, its setup,
	// its exec.
	helperTimeout = 30 * time.Second
	// maxHelperMsg bounds one control message (a config holds the
	// process's args and env).
	maxHelperMsg = 1 << 20
)

// Control messages. The helper says idle once its runtime is up, then
// prepared once it applied a config (or failed, which it says and exits);
// the agent sends the config with the process's stdin, stdout and stderr
// attached, then start. The helper's exec closes its end (close-on-exec),
// which tells the agent the program runs; a failed exec is said as an
// error.
const (
	msgIdle     byte = 'i'
	msgPrepared byte = 'p'
	msgStart    byte = 's'
	msgError    byte = 'e'
)

// helperReady says ExecHelper ran and returned: this binary can serve as
// the exec helper.
var helperReady atomic.Bool

// helperConfig is the process the helper becomes and what it applies
// before its exec.
type helperConfig struct {
	Path            string   `json:"path"`
	Args            []string `json:"args"`
	Env             []string `json:"env"`
	Terminal        bool     `json:"terminal,omitempty"`
	Root            string   `json:"root,omitempty"`
	Cwd             string   `json:"cwd"`
	UID             uint32   `json:"uid"`
	GID             uint32   `json:"gid"`
	Groups          []uint32 `json:"groups,omitempty"`
	Rlimits         []rlimit `json:"rlimits,omitempty"`
	Umask           *uint32  `json:"umask,omitempty"`
	NoNewPrivileges bool     `json:"noNewPrivileges,omitempty"`
}

// sampleConfig is decoded once by every helper as it starts, so that a
// spare helper restored from a snapshot finds json's caches for
// helperConfig built.
const sampleConfig = `{"path":"/bin/sh","args":["sh"],"env":["A=b"],"terminal":true,"root":"/r","cwd":"/",` +
	`"uid":1,"gid":1,"groups":[1],"rlimits":[{"Name":"RLIMIT_NOFILE","Resource":7,"Soft":1,"Hard":1}],` +
	`"umask":18,"noNewPrivileges":true}`

// ExecHelper must run first in main of a binary that serves the agent API,
// and in TestMain of tests that start processes through the agent. When the
// binary was started as the agent's exec helper, it becomes the process
// the agent sends it, never returning; otherwise it returns at once.
//
// Go cannot run code between fork and exec, and rlimits, the umask and
// no_new_privileges set in the agent would apply to the agent itself; so
// the agent re-executes itself as a helper that applies them and then
// execs the process, which keeps the helper's pid. A helper waits for its
// config, so the agent starts one ahead of need (a spare): a snapshot
// carries it, and a restored guest's first process pays no Go runtime
// start.
func ExecHelper() {
	if len(os.Args) != 1 || os.Args[0] != execHelperName {
		helperReady.Store(true)
		return
	}
	// Credentials and no_new_privileges are set on this thread, which
	// then execs: they become the process's.
	runtime.LockOSThread()
	err := runHelper()
	if err != nil {
		_ = unix.Sendmsg(helperCtlFD, append([]byte{msgError}, err.Error()...), nil, nil, 0)
	}
	os.Exit(127)
}

// errAbandoned is a helper whose agent went away before start.
var errAbandoned = errors.New("the agent abandoned its helper")

func runHelper() error {
	if _, err := unix.FcntlInt(helperCtlFD, unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
		return fmt.Errorf("exec helper: %w", err)
	}
	var warm helperConfig
	_ = json.Unmarshal([]byte(sampleConfig), &warm)
	if err := unix.Sendmsg(helperCtlFD, []byte{msgIdle}, nil, nil, 0); err != nil {
		return fmt.Errorf("exec helper: %w", err)
	}
	c, err := receiveConfig()
	if err != nil {
		return err
	}
	if err := c.apply(); err != nil {
		return err
	}
	if err := unix.Sendmsg(helperCtlFD, []byte{msgPrepared}, nil, nil, 0); err != nil {
		return errAbandoned
	}
	buf := make([]byte, 1)
	if n, _, _, _, err := unix.Recvmsg(helperCtlFD, buf, nil, 0); err != nil || n != 1 || buf[0] != msgStart {
		return errAbandoned
	}
	err = syscall.Exec(c.Path, c.Args, c.Env)
	return fmt.Errorf("exec %s: %w", c.Path, err)
}

// receiveConfig reads the config and puts the stdio it carries on fds 0,
// 1 and 2.
func receiveConfig() (*helperConfig, error) {
	buf := make([]byte, maxHelperMsg)
	oob := make([]byte, unix.CmsgSpace(3*4))
	n, oobn, _, _, err := unix.Recvmsg(helperCtlFD, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil || n == 0 {
		return nil, errAbandoned
	}
	fds, err := stdioRights(oob[:oobn])
	if err != nil {
		return nil, fmt.Errorf("exec helper stdio: %w", err)
	}
	var c helperConfig
	if err := json.Unmarshal(buf[:n], &c); err != nil {
		return nil, fmt.Errorf("exec helper config: %w", err)
	}
	for i, fd := range fds {
		if err := unix.Dup3(fd, i, 0); err != nil {
			return nil, fmt.Errorf("exec helper stdio: %w", err)
		}
	}
	return &c, nil
}

func stdioRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil || len(msgs) != 1 {
		return nil, fmt.Errorf("want one control message with the stdio, got %d (%v)", len(msgs), err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 3 {
		return nil, fmt.Errorf("want 3 stdio fds, got %d (%v)", len(fds), err)
	}
	return fds, nil
}

// apply sets up everything but the program, in this process.
func (c *helperConfig) apply() error {
	if c.Terminal {
		// A session leader's new controlling terminal: its stdin.
		if err := unix.IoctlSetInt(0, unix.TIOCSCTTY, 0); err != nil {
			return fmt.Errorf("set the controlling terminal: %w", err)
		}
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
	return nil
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

// helper is the agent's side of one exec helper: its process and its
// control socket.
type helper struct {
	cmd *exec.Cmd
	ctl *net.UnixConn
}

// spawnHelper starts a helper in a new session and waits until it is idle.
func spawnHelper() (*helper, error) {
	if !helperReady.Load() {
		return nil, fmt.Errorf("rlimits, a umask or no_new_privileges need the exec helper, which this binary does not run (server.ExecHelper): %w", errdefs.ErrNotImplemented)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("create exec helper socket: %w", err)
	}
	child := os.NewFile(uintptr(fds[1]), "exec-helper")
	defer child.Close()
	ctl, err := unixConn(fds[0])
	if err != nil {
		return nil, err
	}
	h := &helper{
		cmd: &exec.Cmd{Path: "/proc/self/exe", Args: []string{execHelperName}, ExtraFiles: []*os.File{child},
			SysProcAttr: &syscall.SysProcAttr{Setsid: true}},
		ctl: ctl,
	}
	if err := h.cmd.Start(); err != nil {
		ctl.Close()
		return nil, fmt.Errorf("start exec helper: %w", err)
	}
	if err := h.expect(msgIdle); err != nil {
		h.abandon()
		return nil, err
	}
	return h, nil
}

func unixConn(fd int) (*net.UnixConn, error) {
	f := os.NewFile(uintptr(fd), "exec-helper")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("exec helper socket: %w", err)
	}
	return c.(*net.UnixConn), nil
}

// prepare hands the helper c and the process's stdio and waits until it
// applied c.
func (h *helper) prepare(c helperConfig, stdio [3]*os.File) error {
	data, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("exec helper config: %w", err)
	}
	rights := unix.UnixRights(int(stdio[0].Fd()), int(stdio[1].Fd()), int(stdio[2].Fd()))
	_ = h.ctl.SetWriteDeadline(time.Now().Add(helperTimeout))
	if _, _, err := h.ctl.WriteMsgUnix(data, rights, nil); err != nil {
		return fmt.Errorf("send exec helper its config: %w", err)
	}
	return h.expect(msgPrepared)
}

// start lets the helper exec the program and waits until it did.
func (h *helper) start() error {
	_ = h.ctl.SetWriteDeadline(time.Now().Add(helperTimeout))
	if _, err := h.ctl.Write([]byte{msgStart}); err != nil {
		return fmt.Errorf("start exec helper: %w", err)
	}
	err := h.expect(0)
	if errors.Is(err, io.EOF) {
		h.ctl.Close()
		return nil
	}
	return err
}

// expect reads the helper's next message and wants it to be want; 0
// wants none (the socket's end, io.EOF).
func (h *helper) expect(want byte) error {
	buf := make([]byte, maxHelperMsg)
	_ = h.ctl.SetReadDeadline(time.Now().Add(helperTimeout))
	n, err := h.ctl.Read(buf)
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("exec helper did not answer within %v", helperTimeout)
	case n == 0 && (err == nil || errors.Is(err, io.EOF)):
		if want == 0 {
			return io.EOF
		}
		return fmt.Errorf("exec helper exited: %w", errdefs.ErrFailedPrecondition)
	case err != nil:
		return fmt.Errorf("read exec helper: %w", err)
	case buf[0] == msgError:
		return fmt.Errorf("%s: %w", buf[1:n], errdefs.ErrFailedPrecondition)
	case buf[0] != want || n != 1:
		return fmt.Errorf("exec helper said %q, want %q", buf[:n], want)
	}
	return nil
}

// abandon ends a helper that will not become a process.
func (h *helper) abandon() {
	h.ctl.Close()
	_ = h.cmd.Process.Kill()
	_ = h.cmd.Wait()
}
