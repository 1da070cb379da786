package server

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/moby/sys/user"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// passwdPath is where Exec looks up users.
var passwdPath = "/etc/passwd"

// procSpec is a validated Exec request.
type procSpec struct {
	path string // resolved executable
	args []string
	env  []string
	cwd  string
	uid  uint32
	gid  uint32
	gids []uint32
}

// newProcSpec checks r and resolves what the process needs, so that bad
// input fails here with a message saying what was wrong.
func newProcSpec(r *api.ExecRequest) (*procSpec, error) {
	if r.Id == "" {
		return nil, fmt.Errorf("exec id is empty: %w", errdefs.ErrInvalidArgument)
	}
	if len(r.Args) == 0 || r.Args[0] == "" {
		return nil, fmt.Errorf("exec %q: args are empty, expected at least the program to run: %w", r.Id, errdefs.ErrInvalidArgument)
	}
	home, err := homeOf(r.Uid)
	if err != nil {
		return nil, fmt.Errorf("exec %q: %w", r.Id, err)
	}
	spec := &procSpec{args: r.Args, cwd: r.Cwd, uid: r.Uid, gid: r.Gid, gids: r.AdditionalGids}
	spec.env = withDefaults(r.Env, home)
	if spec.cwd == "" {
		spec.cwd = "/"
	}
	if err := checkDir(spec.cwd); err != nil {
		return nil, fmt.Errorf("exec %q: %w", r.Id, err)
	}
	if spec.path, err = lookPath(r.Args[0], spec.cwd, spec.env); err != nil {
		return nil, fmt.Errorf("exec %q: %w", r.Id, err)
	}
	return spec, nil
}

// homeOf is uid's home directory from the guest's passwd. As with runc, a
// uid needs no entry (nor the file exist): it then runs with HOME=/.
func homeOf(uid uint32) (string, error) {
	users, err := user.ParsePasswdFileFilter(passwdPath, func(u user.User) bool { return u.Uid == int(uid) })
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "/", nil
	case err != nil:
		return "", fmt.Errorf("read %s: %w", passwdPath, err)
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

func checkDir(dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("cwd %q is not an absolute path: %w", dir, errdefs.ErrInvalidArgument)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("cwd %q does not exist in the guest: %w", dir, errdefs.ErrInvalidArgument)
	}
	if !fi.IsDir() {
		return fmt.Errorf("cwd %q is not a directory: %w", dir, errdefs.ErrInvalidArgument)
	}
	return nil
}

// lookPath finds the program like execvp would, with the process's own PATH.
func lookPath(prog, cwd string, env []string) (string, error) {
	if strings.Contains(prog, "/") {
		p := prog
		if !filepath.IsAbs(p) {
			p = filepath.Join(cwd, p)
		}
		if err := checkExecutable(p); err != nil {
			return "", fmt.Errorf("program %q: %w", prog, err)
		}
		return p, nil
	}
	path, _ := getenv(env, "PATH")
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(cwd, dir)
		}
		if p := filepath.Join(dir, prog); checkExecutable(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("program %q not found in PATH %q: %w", prog, path, errdefs.ErrInvalidArgument)
}

func checkExecutable(p string) error {
	fi, err := os.Stat(p)
	switch {
	case err != nil:
		return fmt.Errorf("not found in the guest: %w", errdefs.ErrInvalidArgument)
	case fi.IsDir():
		return fmt.Errorf("is a directory: %w", errdefs.ErrInvalidArgument)
	case fi.Mode().Perm()&0o111 == 0:
		return fmt.Errorf("is not executable: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}
