package server

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

func TestNewProcSpec(t *testing.T) {
	dir := t.TempDir()
	prog := filepath.Join(dir, "prog")
	if err := os.WriteFile(prog, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "data"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	passwd := filepath.Join(dir, "passwd")
	if err := os.WriteFile(passwd, []byte("root:x:0:0:root:/root:/bin/sh\nnohome:x:8:8:::/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := passwdPath
	passwdPath = passwd
	t.Cleanup(func() { passwdPath = old })

	for _, tc := range []struct {
		name     string
		req      *api.ExecRequest
		wantPath string
		wantEnv  []string
		wantErr  string
	}{
		{"search PATH", &api.ExecRequest{Id: "a", Args: []string{"prog"}, Env: []string{"PATH=" + dir}}, prog, []string{"PATH=" + dir, "HOME=/root"}, ""},
		{"relative to cwd", &api.ExecRequest{Id: "a", Args: []string{"./prog"}, Cwd: dir}, prog, []string{defaultPath, "HOME=/root"}, ""},
		{"HOME kept", &api.ExecRequest{Id: "a", Args: []string{prog}, Env: []string{"HOME=/h"}}, prog, []string{"HOME=/h", defaultPath}, ""},
		{"not executable", &api.ExecRequest{Id: "a", Args: []string{filepath.Join(dir, "data")}}, "", nil, "is not executable"},
		{"a directory", &api.ExecRequest{Id: "a", Args: []string{dir}}, "", nil, "is a directory"},
		{"cwd is a file", &api.ExecRequest{Id: "a", Args: []string{prog}, Cwd: prog}, "", nil, "is not a directory"},
		{"uid without a passwd entry", &api.ExecRequest{Id: "a", Args: []string{prog}, Uid: 7}, prog, []string{defaultPath, "HOME=/"}, ""},
		{"uid without a passwd entry keeps HOME", &api.ExecRequest{Id: "a", Args: []string{prog}, Env: []string{"HOME=/h"}, Uid: 7}, prog, []string{"HOME=/h", defaultPath}, ""},
		{"entry without a home", &api.ExecRequest{Id: "a", Args: []string{prog}, Uid: 8}, prog, []string{defaultPath}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec, err := newProcSpec(tc.req, "")
			if tc.wantErr != "" {
				if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want invalid argument saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if spec.path != tc.wantPath || !slices.Equal(spec.env, tc.wantEnv) {
				t.Errorf("path %q env %q, want %q %q", spec.path, spec.env, tc.wantPath, tc.wantEnv)
			}
		})
	}
}

func TestNewProcSpecWithoutPasswd(t *testing.T) {
	old := passwdPath
	passwdPath = filepath.Join(t.TempDir(), "passwd")
	t.Cleanup(func() { passwdPath = old })
	spec, err := newProcSpec(&api.ExecRequest{Id: "a", Args: []string{"/bin/sh"}, Uid: 1000}, "")
	if err != nil {
		t.Fatal(err)
	}
	if home, _ := getenv(spec.env, "HOME"); home != "/" {
		t.Errorf("HOME %q without a passwd file, want /", home)
	}
}

func TestNewProcSpecLimits(t *testing.T) {
	big := uint32(0o1000)
	for _, tc := range []struct {
		name string
		req  *api.ExecRequest
		want string
	}{
		{"unknown rlimit", &api.ExecRequest{Rlimits: []*api.Rlimit{{Type: "RLIMIT_FOO"}}}, `rlimit "RLIMIT_FOO": expected an OCI name`},
		{"soft above hard", &api.ExecRequest{Rlimits: []*api.Rlimit{{Type: "RLIMIT_NOFILE", Soft: 2, Hard: 1}}}, "soft 2 above hard 1"},
		{"rlimit twice", &api.ExecRequest{Rlimits: []*api.Rlimit{{Type: "RLIMIT_CORE"}, {Type: "RLIMIT_CORE"}}}, "given twice"},
		{"umask", &api.ExecRequest{Umask: &big}, "umask 01000: expected at most 0777"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.Id, tc.req.Args = "a", []string{"/bin/sh"}
			_, err := newProcSpec(tc.req, "")
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want invalid argument saying %q", err, tc.want)
			}
		})
	}
}

// TestNewProcSpecInRoot: paths, the user's home and the cwd resolve inside
// the container's root, whatever its symlinks say.
func TestNewProcSpecInRoot(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"bin", "etc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{"bin/busybox": "#!", "etc/passwd": "app:x:1000:1000::/home/app:/bin/sh\n"}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(root, name), []byte(data), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{"bin/sh": "/bin/busybox", "bin/hostonly": "/usr/bin/env", "up": "../../.."}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	spec, err := newProcSpec(&api.ExecRequest{Id: "a", Args: []string{"sh"}, Uid: 1000, Cwd: "/up/new"}, root)
	if err != nil {
		t.Fatal(err)
	}
	if home, _ := getenv(spec.env, "HOME"); spec.path != "/bin/sh" || spec.cwd != "/up/new" || home != "/home/app" {
		t.Errorf("path %q cwd %q HOME %q, want /bin/sh, /up/new and the image's home", spec.path, spec.cwd, home)
	}
	if _, err := os.Stat(filepath.Join(root, "new")); err != nil {
		t.Errorf("the missing cwd was not made inside the root: %v", err)
	}
	for _, prog := range []string{"hostonly", "/usr/bin/env"} {
		_, err := newProcSpec(&api.ExecRequest{Id: "a", Args: []string{prog}}, root)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "in the container") {
			t.Errorf("%s: %v, want not found in the container", prog, err)
		}
	}
}

// TestExecHelperRequired: a binary that never called ExecHelper refuses
// what needs it instead of re-executing itself as something else.
func TestExecHelperRequired(t *testing.T) {
	helperReady.Store(false)
	t.Cleanup(func() { helperReady.Store(true) })
	spec, err := newProcSpec(&api.ExecRequest{Id: "a", Args: []string{"/bin/sh"}, NoNewPrivileges: true}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := startProcess("a", spec, false, false); !errdefs.IsNotImplemented(err) || !strings.Contains(err.Error(), "server.ExecHelper") {
		t.Errorf("start without the helper: %v, want not implemented", err)
	}
}

// TestExecHelperFails: the helper's failure to exec comes back as Exec's
// error, not as a process that exits 127.
func TestExecHelperFails(t *testing.T) {
	testenv.RequireRoot(t) // the helper sets the process's credentials
	prog := filepath.Join(t.TempDir(), "prog")
	if err := os.WriteFile(prog, []byte("not a program"), 0o755); err != nil {
		t.Fatal(err)
	}
	spec, err := newProcSpec(&api.ExecRequest{Id: "a", Args: []string{prog}, NoNewPrivileges: true}, "")
	if err != nil {
		t.Fatal(err)
	}
	_, err = startProcess("a", spec, false, false)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "exec "+prog+": exec format error") {
		t.Errorf("start: %v, want the helper's exec error", err)
	}
}
