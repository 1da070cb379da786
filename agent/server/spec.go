package server

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
	securejoin "github.com/cyphar/filepath-securejoin"
	"github.com/moby/sys/user"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
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
}

// newProcSpec checks r and resolves what the process needs in root (the
// container's root, or "" for the guest's), so that bad input fails here
// with a message saying what was wrong.
func newProcSpec(r *api.ExecRequest, root string) (*procSpec, error) {
	if r.Id == "" {
		return nil, fmt.Errorf("exec id is empty: %w", errdefs.ErrInvalidArgument)
	}
	if len(r.Args) == 0 || r.Args[0] == "" {
		return nil, fmt.Errorf("exec %q: args are empty, expected at least the program to run: %w", r.Id, errdefs.ErrInvalidArgument)
	}
	spec := &procSpec{
		root: root, args: r.Args, cwd: r.Cwd, uid: r.Uid, gid: r.Gid, gids: r.AdditionalGids,
		umask: r.Umask, noNewPrivileges: r.NoNewPrivileges,
	}
	var err error
	if spec.rlimits, err = parseRlimits(r.Rlimits); err != nil {
		return nil, fmt.Errorf("exec %q: %w", r.Id, err)
	}
	if r.Umask != nil && *r.Umask > 0o777 {
		return nil, fmt.Errorf("exec %q: umask %#o: expected at most 0777: %w", r.Id, *r.Umask, errdefs.ErrInvalidArgument)
	}
	passwd := passwdPath
	if root != "" {
		passwd, _ = securejoin.SecureJoin(root, "/etc/passwd")
	}
	home, err := homeOf(r.Uid, passwd)
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
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("cwd %q does not exist in the guest: %w", s.cwd, errdefs.ErrInvalidArgument)
	}
	if !fi.IsDir() {
		return fmt.Errorf("cwd %q is not a directory: %w", s.cwd, errdefs.ErrInvalidArgument)
	}
	return nil
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
		if err := checkExecutable(s.inRoot(p)); err != nil {
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
		if p := filepath.Join(dir, prog); checkExecutable(s.inRoot(p)) == nil {
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

func checkExecutable(p string) error {
	fi, err := os.Stat(p)
	switch {
	case err != nil:
		return errNotFound
	case fi.IsDir():
		return fmt.Errorf("is a directory: %w", errdefs.ErrInvalidArgument)
	case fi.Mode().Perm()&0o111 == 0:
		return fmt.Errorf("is not executable: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}
