package server

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
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
			spec, err := newProcSpec(tc.req, "", nil)
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
	spec, err := newProcSpec(&api.ExecRequest{Id: "a", Args: []string{"/bin/sh"}, Uid: 1000}, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if home, _ := getenv(spec.env, "HOME"); home != "/" {
		t.Errorf("HOME %q without a passwd file, want /", home)
	}
}

// TestProcSpecPIDNamespace: a process asking for a PID namespace of its
// own (a pod's pause) is cloned into a new one; any other is not.
func TestProcSpecPIDNamespace(t *testing.T) {
	for _, own := range []bool{true, false} {
		spec, err := newProcSpec(&api.ExecRequest{Id: "a", Args: []string{"/bin/sh"}, OwnPidNamespace: own}, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		got := spec.command().SysProcAttr.Cloneflags&syscall.CLONE_NEWPID != 0
		if got != own {
			t.Errorf("own PID namespace %v: CLONE_NEWPID %v", own, got)
		}
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
			_, err := newProcSpec(tc.req, "", nil)
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
	spec, err := newProcSpec(&api.ExecRequest{Id: "a", Args: []string{"sh"}, Uid: 1000, Cwd: "/up/new"}, root, nil)
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
		_, err := newProcSpec(&api.ExecRequest{Id: "a", Args: []string{prog}}, root, nil)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "in the container") {
			t.Errorf("%s: %v, want not found in the container", prog, err)
		}
	}
}

// TestBootRootResolves: a process in the guest's root resolves from what
// the agent read at boot exactly as from the disk.
func TestBootRootResolves(t *testing.T) {
	boot := readBootRoot()
	if boot == nil {
		t.Fatal("cannot read the root")
	}
	for _, r := range []*api.ExecRequest{
		{Id: "a", Args: []string{"sh"}, Cwd: "/"},
		{Id: "a", Args: []string{"/bin/sh"}},
		{Id: "a", Args: []string{"ls"}, Uid: 65534, Cwd: "/tmp"},
		{Id: "a", Args: []string{"sh"}, Uid: 4242},
		{Id: "a", Args: []string{"no-such-program"}},
		{Id: "a", Args: []string{"/no/such/program"}},
		{Id: "a", Args: []string{"usr"}, Env: []string{"PATH=/"}},
		{Id: "a", Args: []string{"sh"}, Cwd: "/no/such/dir"},
	} {
		disk, diskErr := newProcSpec(r, "", nil)
		view, viewErr := newProcSpec(r, "", boot)
		if (diskErr == nil) != (viewErr == nil) || (diskErr != nil && diskErr.Error() != viewErr.Error()) {
			t.Errorf("%v in %q: %v from the disk, %v from the boot view", r.Args, r.Cwd, diskErr, viewErr)
			continue
		}
		if diskErr == nil && (disk.path != view.path || !slices.Equal(disk.env, view.env) || disk.cwd != view.cwd) {
			t.Errorf("%v in %q: %s %v from the disk, %s %v from the boot view", r.Args, r.Cwd, disk.path, disk.env, view.path, view.env)
		}
	}
}

// TestBootRootUsed: what the boot view holds is not looked up again.
func TestBootRootUsed(t *testing.T) {
	boot := &bootRoot{
		homes:   map[uint32]string{0: "/home/booted"},
		modes:   map[string]fs.FileMode{"/": fs.ModeDir | 0o755, "/booted/prog": 0o755},
		scanned: map[string]bool{"/booted": true},
	}
	spec, err := newProcSpec(&api.ExecRequest{Id: "a", Args: []string{"prog"}, Env: []string{"PATH=/booted"}, Cwd: "/"}, "", boot)
	if err != nil {
		t.Fatal(err)
	}
	if spec.path != "/booted/prog" || !slices.Contains(spec.env, "HOME=/home/booted") {
		t.Errorf("resolved %s %v, want the boot view's program and home", spec.path, spec.env)
	}
}

// TestBootRootForgotten: the boot view goes once a process may have
// changed the guest's files, or Init wrote one the view covers.
func TestBootRootForgotten(t *testing.T) {
	for _, tc := range []struct {
		name string
		init *api.InitRequest
	}{
		{"process", &api.InitRequest{Process: &api.ExecRequest{Id: "p", Args: []string{"true"}, Cwd: "/"}}},
		{"passwd", &api.InitRequest{Files: []*api.File{{Path: passwdPath}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			old := passwdPath
			passwdPath = filepath.Join(dir, "passwd")
			t.Cleanup(func() { passwdPath = old })
			if err := os.WriteFile(passwdPath, []byte("root:x:0:0::/root:/bin/sh\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if tc.init.Files != nil {
				tc.init.Files[0].Path = passwdPath
			}
			g := newFakeGuest(t, WithFreshBoot())
			if g.svc.boot.Load() == nil {
				t.Fatal("no boot view after a fresh boot")
			}
			if _, err := g.svc.Init(context.Background(), tc.init); err != nil {
				t.Fatal(err)
			}
			if g.svc.boot.Load() != nil {
				t.Error("the boot view outlived what changed the guest's files")
			}
		})
	}
}
