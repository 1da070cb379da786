package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// rootfsChildEnv carries the config of a test child that mounts a real
// rootfs in its private mount namespace.
const rootfsChildEnv = "COCOON_TEST_ROOTFS_CHILD"

type rootfsChildConfig struct {
	State, Image, Files, Hello string
}

// TestRealRootfs mounts an ext4 image (on a loop device standing in for the
// virtio-blk disk) with the real mount code, in a child's private mount
// namespace, and runs processes in it; the host's
// mounts never change.
func TestRealRootfs(t *testing.T) {
	testenv.RequireRoot(t)
	mkfs := testenv.LookPath(t, "mkfs.ext4")
	busybox := testenv.LookPath(t, "busybox")
	src := t.TempDir()
	hello := make([]byte, 16)
	_, _ = rand.Read(hello)
	c := rootfsChildConfig{State: t.TempDir(), Files: t.TempDir(), Image: filepath.Join(t.TempDir(), "rootfs.img"), Hello: hex.EncodeToString(hello)}
	makeImageTree(t, src, busybox, c.Hello)
	if out, err := exec.Command(mkfs, "-q", "-d", src, c.Image, "32M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	config, _ := json.Marshal(c)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), rootfsChildEnv+"="+string(config))
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: unix.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("rootfs child: %v\n%s", err, out)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mi), c.State) {
		t.Errorf("the child's mounts reached the host's mount namespace")
	}
}

// makeImageTree lays out a small image: a static busybox with a few
// applets, a passwd with a user, and a file with random content.
func makeImageTree(t *testing.T, dir, busybox, hello string) {
	t.Helper()
	for _, d := range []string{"bin", "etc", "data", "home/app"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"bin/busybox": string(b),
		"etc/passwd":  "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n",
		"data/hello":  hello,
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, applet := range []string{"sh", "cat", "id", "echo", "grep", "test", "umask"} {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
}

// loopDisk is LinuxMounts with a loop device as the rootfs disk.
type loopDisk struct {
	LinuxMounts
	dev string
}

func (l loopDisk) Disk(context.Context, string, uint64) (string, error) { return l.dev, nil }

// rootfsChild runs in the child: it mounts the rootfs for real, checks it
// and runs processes in it; it prints every failure and returns 1 if any.
func rootfsChild(config string) int {
	var c rootfsChildConfig
	if err := json.Unmarshal([]byte(config), &c); err != nil {
		fmt.Println(err)
		return 1
	}
	loop, err := mount.SetupLoop(c.Image, mount.LoopParams{Readonly: true, Autoclear: true})
	if err != nil {
		fmt.Println("attach the image:", err)
		return 1
	}
	defer loop.Close()
	svc := New(&fakeSystem{j: &journal{}}, WithMounter(loopDisk{dev: loop.Name()}), WithStateDir(c.State))
	ck := &checker{}
	checkRealRootfs(ck, svc, c)
	return ck.result()
}

type checker struct{ failed bool }

func (c *checker) errorf(format string, args ...any) {
	c.failed = true
	fmt.Printf(format+"\n", args...)
}

func (c *checker) result() int {
	if c.failed {
		return 1
	}
	return 0
}

func checkRealRootfs(ck *checker, svc *Service, c rootfsChildConfig) {
	ctx := context.Background()
	resolv := filepath.Join(c.Files, "resolv.conf")
	init := &api.InitRequest{
		Files:  []*api.File{{Path: resolv, Data: []byte("nameserver 10.0.0.1\n")}},
		Rootfs: &api.Rootfs{Fstype: "ext4", Serial: "cocoon-rootfs", Mounts: ociMounts(resolv)},
	}
	bad := &api.InitRequest{Rootfs: &api.Rootfs{Fstype: "ext4", Serial: "cocoon-rootfs", Mounts: []*api.Mount{
		{Destination: "/proc", Type: "proc"},
		{Destination: "/etc/x", Type: "bind", Source: "/no/such/file"},
	}}}
	if _, err := svc.Init(ctx, bad); err == nil {
		ck.errorf("Init with a missing bind source succeeded")
	}
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), c.State) {
		ck.errorf("a failed Init left mounts behind:\n%s", mi)
	}
	if _, err := svc.Init(ctx, init); err != nil {
		ck.errorf("Init: %v", err)
		return
	}
	checkMountinfo(ck, filepath.Join(c.State, "root"))
	for _, tc := range realExecCases(c.Hello) {
		got, err := runIn(svc, tc.req)
		if err != nil || got != tc.want {
			ck.errorf("%s: %q %v, want %q", tc.name, got, err, tc.want)
		}
	}
	if _, err := os.Stat(filepath.Join(c.State, "lower/data/new")); err == nil {
		ck.errorf("a write in the container reached the read-only disk")
	}
	_, err := svc.Exec(ctx, &api.ExecRequest{Id: "missing", Args: []string{"/no/such/program"}})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "not found in the container") {
		ck.errorf("exec of a missing program: %v, want invalid argument", err)
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil || lim.Cur == 123 {
		ck.errorf("the agent's own RLIMIT_NOFILE is %d %v: the process's rlimits leaked", lim.Cur, err)
	}
	if _, err := svc.Init(ctx, init); err != nil {
		ck.errorf("the same rootfs again: %v", err)
	}
	init.Rootfs.Serial = "other"
	if _, err := svc.Init(ctx, init); !errdefs.IsFailedPrecondition(err) {
		ck.errorf("another rootfs: %v, want failed precondition", err)
	}
}

// checkMountinfo checks the kinds and read-only flags of the mounts in root.
func checkMountinfo(ck *checker, root string) {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		ck.errorf("read mountinfo: %v", err)
		return
	}
	got := map[string]string{}
	for _, line := range strings.Split(string(mi), "\n") {
		f := strings.Fields(line)
		if len(f) < 10 {
			continue
		}
		sep := 6
		for f[sep] != "-" {
			sep++
		}
		opts := strings.Split(f[5], ",")
		got[f[4]] = f[sep+1] + " " + opts[0]
	}
	for dst, want := range map[string]string{
		"": "overlay rw", "/proc": "proc rw", "/dev": "tmpfs rw", "/dev/pts": "devpts rw",
		"/dev/shm": "tmpfs rw", "/dev/mqueue": "mqueue rw", "/sys": "sysfs ro",
		"/sys/fs/cgroup": "cgroup2 ro", "/etc/resolv.conf": "* ro", // a file on the host's temp dir
	} {
		g := got[root+dst]
		if kind, flag, _ := strings.Cut(want, " "); kind == "*" && strings.HasSuffix(g, " "+flag) {
			continue
		}
		if g != want {
			ck.errorf("mount at %q: %q, want %q", dst, g, want)
		}
	}
}

type realExecCase struct {
	name string
	req  *api.ExecRequest
	want string
}

func realExecCases(hello string) []realExecCase {
	sh := func(id, script string) *api.ExecRequest {
		return &api.ExecRequest{Id: id, Args: []string{"sh", "-c", script}}
	}
	umask := uint32(0o027)
	limits := sh("limits", "ulimit -n; ulimit -Hn; umask; grep NoNewPrivs /proc/self/status")
	limits.Rlimits = []*api.Rlimit{{Type: "RLIMIT_NOFILE", Soft: 123, Hard: 456}}
	limits.Umask, limits.NoNewPrivileges = &umask, true
	user := sh("user", "id -u; id -g; id -G; echo $HOME")
	user.Uid, user.Gid, user.AdditionalGids = 1000, 1000, []uint32{5}
	userLimited := sh("user-limited", "id -u; ulimit -n")
	userLimited.Uid, userLimited.Gid = 1000, 1000
	userLimited.Rlimits = []*api.Rlimit{{Type: "RLIMIT_NOFILE", Soft: 64, Hard: 64}}
	return []realExecCase{
		{"image file", &api.ExecRequest{Id: "hello", Args: []string{"cat", "/data/hello"}}, hello},
		{"rlimits, umask and no_new_privs", limits, "123\n456\n0027\nNoNewPrivs:\t1\n"},
		{"user", user, "1000\n1000\n1000 5\n/home/app\n"},
		{"user with rlimits", userLimited, "1000\n64\n"},
		{"overlay write", sh("write", "echo x > /data/new && cat /data/new"), "x\n"},
		{"dev", sh("dev", "test -c /dev/null && test -c /dev/urandom && echo ok"), "ok\n"},
		{"read-only resolv.conf", sh("resolv", "cat /etc/resolv.conf; echo y 2>/dev/null >/etc/resolv.conf || echo ro"), "nameserver 10.0.0.1\nro\n"},
		{"cwd made", &api.ExecRequest{Id: "cwd", Args: []string{"sh", "-c", "echo $PWD"}, Cwd: "/work/dir"}, "/work/dir\n"},
	}
}

// runIn runs req through svc and returns its stdout once it exits 0.
func runIn(svc *Service, req *api.ExecRequest) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := svc.Exec(ctx, req); err != nil {
		return "", err
	}
	var out []byte
	for {
		r, err := svc.ReadOutput(ctx, &api.ReadOutputRequest{Id: req.Id, Stream: api.Stream_STDOUT})
		if err != nil {
			return "", err
		}
		out = append(out, r.Data...)
		if r.Eof {
			break
		}
	}
	st, err := svc.Wait(ctx, &api.ProcessRequest{Id: req.Id})
	if err != nil {
		return "", err
	}
	if st.ExitCode != 0 {
		return string(out), fmt.Errorf("exit %d", st.ExitCode)
	}
	return string(out), nil
}
