package server

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/containerd/errdefs"
	securejoin "github.com/cyphar/filepath-securejoin"
	"github.com/moby/sys/user"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/server/seccomp"
)

const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// passwdPath is where Exec looks up users in the guest's own root.
var passwdPath = "/etc/passwd"

// procSpec is a validated Exec request.
type procSpec struct {
	root            string // the container's root, or "" for the guest's
	path            string // resolved executable, inside root
	args            []string
	env             []string
	cwd             string // inside root
	uid             uint32
	gid             uint32
	gids            []uint32
	rlimits         []rlimit
	umask           *uint32
	noNewPrivileges bool
	ownPIDNamespace bool      // pid 1 of a PID namespace of its own
	boot            *bootRoot // what the guest's root held at boot; nil in a container root
	caps            *capSet   // nil: the agent's
	seccomp         *seccomp.Filter
	mountNS         *os.File // the confined guest root's (see guestRoot); nil: the agent's
}

// newProcSpec checks r and resolves what the process needs in root (the
// container's root, or "" for the guest's, looked up in boot when it is
// not nil), so that bad input fails here with a message saying what was
// wrong.
func newProcSpec(r *api.ExecRequest, root string, boot *bootRoot) (*procSpec, error) {
	rlimits, err := checkExec(r)
	if err != nil {
		return nil, err
	}
	spec := &procSpec{
		root: root, args: r.Args, cwd: r.Cwd, uid: r.Uid, gid: r.Gid, gids: r.AdditionalGids,
		rlimits: rlimits, umask: r.Umask, noNewPrivileges: r.NoNewPrivileges,
		ownPIDNamespace: r.OwnPidNamespace,
	}
	if root == "" {
		spec.boot = boot
	}
	if spec.caps, err = newCapSet(r.Capabilities); err != nil {
		return nil, fmt.Errorf("exec %q: %w", r.Id, err)
	}
	if spec.seccomp, err = newSeccomp(r.Seccomp); err != nil {
		return nil, fmt.Errorf("exec %q: %w", r.Id, err)
	}
	home, err := spec.home(r.Uid)
	if err != nil {
		return nil, fmt.Errorf("exec %q: %w", r.Id, err)
	}
	spec.env = withDefaults(r.Env, home)
	if spec.cwd == "" {
		spec.cwd = "/"
	}
	if err := spec.checkCwd(); err != nil {
		return nil, fmt.Errorf("exec %q: %w", r.Id, err)
	}
	if spec.path, err = spec.lookPath(r.Args[0]); err != nil {
		return nil, fmt.Errorf("exec %q: %w", r.Id, err)
	}
	return spec, nil
}

// checkExec checks what r says of its process, before its program and
// cwd are looked up, and returns its rlimits.
func checkExec(r *api.ExecRequest) ([]rlimit, error) {
	if r.Id == "" {
		return nil, fmt.Errorf("exec id is empty: %w", errdefs.ErrInvalidArgument)
	}
	if len(r.Args) == 0 || r.Args[0] == "" {
		return nil, fmt.Errorf("exec %q: args are empty, expected at least the program to run: %w", r.Id, errdefs.ErrInvalidArgument)
	}
	rlimits, err := parseRlimits(r.Rlimits)
	if err != nil {
		return nil, fmt.Errorf("exec %q: %w", r.Id, err)
	}
	if r.Umask != nil && *r.Umask > 0o777 {
		return nil, fmt.Errorf("exec %q: umask %#o: expected at most 0777: %w", r.Id, *r.Umask, errdefs.ErrInvalidArgument)
	}
	return rlimits, nil
}

// inRoot is where p, a path inside the process's root, is in the agent's.
func (s *procSpec) inRoot(p string) string {
	if s.root == "" {
		return p
	}
	out, err := securejoin.SecureJoin(s.root, p)
	if err != nil {
		return filepath.Join(s.root, p) // only a too deep symlink chain fails
	}
	return out
}

// checkCwd checks the working directory; in a container root a missing
// one is made, as runc does.
func (s *procSpec) checkCwd() error {
	if !filepath.IsAbs(s.cwd) {
		return fmt.Errorf("cwd %q is not an absolute path: %w", s.cwd, errdefs.ErrInvalidArgument)
	}
	dir := s.inRoot(s.cwd)
	if s.root != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("make cwd %q in the container: %w", s.cwd, errdefs.ErrInvalidArgument)
		}
	}
	mode, err := s.stat(dir)
	if err != nil {
		return fmt.Errorf("cwd %q does not exist in the guest: %w", s.cwd, errdefs.ErrInvalidArgument)
	}
	if !mode.IsDir() {
		return fmt.Errorf("cwd %q is not a directory: %w", s.cwd, errdefs.ErrInvalidArgument)
	}
	return nil
}

// stat is os.Stat(p).Mode(), from the boot view when it knows p.
func (s *procSpec) stat(p string) (fs.FileMode, error) {
	if s.boot != nil {
		if mode, exists, known := s.boot.lookup(p); known {
			if !exists {
				return 0, fs.ErrNotExist
			}
			return mode, nil
		}
	}
	fi, err := os.Stat(p)
	if err != nil {
		return 0, err
	}
	return fi.Mode(), nil
}

// home is uid's home directory in the process's root.
func (s *procSpec) home(uid uint32) (string, error) {
	if s.boot != nil {
		return s.boot.home(uid), nil
	}
	passwd := passwdPath
	if s.root != "" {
		passwd, _ = securejoin.SecureJoin(s.root, "/etc/passwd")
	}
	return homeOf(uid, passwd)
}

// homeOf is uid's home directory from the passwd file. As with runc, a
// uid needs no entry (nor the file exist): it then runs with HOME=/.
func homeOf(uid uint32, passwd string) (string, error) {
	users, err := user.ParsePasswdFileFilter(passwd, func(u user.User) bool { return u.Uid == int(uid) })
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "/", nil
	case err != nil:
		return "", fmt.Errorf("read /etc/passwd: %w", err)
	case len(users) == 0:
		return "/", nil
	}
	return users[0].Home, nil
}

// withDefaults adds PATH, and HOME if known, when env lacks them.
func withDefaults(env []string, home string) []string {
	out := append([]string(nil), env...)
	if _, ok := getenv(env, "PATH"); !ok {
		out = append(out, defaultPath)
	}
	if _, ok := getenv(env, "HOME"); !ok && home != "" {
		out = append(out, "HOME="+home)
	}
	return out
}

func getenv(env []string, key string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], key+"="); ok {
			return v, true
		}
	}
	return "", false
}

// lookPath finds the program like execvp would, with the process's own
// PATH, inside the process's root.
func (s *procSpec) lookPath(prog string) (string, error) {
	where := "the guest"
	if s.root != "" {
		where = "the container"
	}
	if strings.Contains(prog, "/") {
		p := prog
		if !filepath.IsAbs(p) {
			p = filepath.Join(s.cwd, p)
		}
		if err := s.checkExecutable(s.inRoot(p)); err != nil {
			return "", fmt.Errorf("program %q: %w", prog, inWhere(err, where))
		}
		return p, nil
	}
	path, _ := getenv(s.env, "PATH")
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(s.cwd, dir)
		}
		if p := filepath.Join(dir, prog); s.checkExecutable(s.inRoot(p)) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("program %q not found in PATH %q in %s: %w", prog, path, where, errdefs.ErrInvalidArgument)
}

var errNotFound = errors.New("not found")

func inWhere(err error, where string) error {
	if errors.Is(err, errNotFound) {
		return fmt.Errorf("not found in %s: %w", where, errdefs.ErrInvalidArgument)
	}
	return err
}

func (s *procSpec) checkExecutable(p string) error {
	mode, err := s.stat(p)
	switch {
	case err != nil:
		return errNotFound
	case mode.IsDir():
		return fmt.Errorf("is a directory: %w", errdefs.ErrInvalidArgument)
	case mode.Perm()&0o111 == 0:
		return fmt.Errorf("is not executable: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// command is the process forked and exec'd by Go, chrooted and with its
// credentials, in a new session (and a new PID namespace when asked). A
// process with a seccomp filter has its forking thread chroot and unshare
// (see confineThread).
func (s *procSpec) command() *exec.Cmd {
	attr := &syscall.SysProcAttr{
		Setsid: true, Chroot: s.root,
		Credential: &syscall.Credential{Uid: s.uid, Gid: s.gid, Groups: s.gids},
	}
	if s.ownPIDNamespace {
		attr.Cloneflags = syscall.CLONE_NEWPID
	}
	if s.seccomp != nil {
		attr.Chroot, attr.Cloneflags = "", 0
	}
	if s.caps != nil {
		attr.AmbientCaps = s.caps.ambient
	}
	return &exec.Cmd{Path: s.path, Args: s.args, Env: s.env, Dir: s.cwd, SysProcAttr: attr}
}
