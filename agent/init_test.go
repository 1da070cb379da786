package agent_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// ipnet is the address and prefix of the constant CIDR s.
func ipnet(s string) net.IPNet {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return net.IPNet{IP: ip, Mask: n.Mask}
}

// TestInitNetworkAndFiles: Init's files land in the guest and its network
// reaches the guest's NIC as given.
func TestInitNetworkAndFiles(t *testing.T) {
	h := newHarness(t)
	c := h.client(t)
	dir := t.TempDir()
	mac, _ := net.ParseMAC("02:12:34:56:78:9a")
	dst := ipnet("10.99.0.0/16")
	r := agent.InitRequest{
		Files: []agent.File{{Path: filepath.Join(dir, "etc/hosts"), Data: []byte("10.88.0.4 clone\n"), Mode: 0o600}},
		Network: &agent.Network{
			MAC: mac, MTU: 1450, Addresses: []net.IPNet{ipnet("10.88.0.4/16"), ipnet("fd00::4/64")},
			Routes: []agent.Route{
				{Gateway: net.ParseIP("10.88.0.1"), Metric: 10},
				{Dst: &dst, Source: net.ParseIP("10.88.0.4")},
				{Gateway: net.ParseIP("fd00::1"), OnLink: true},
			},
		},
	}
	if _, err := c.Init(ctxT(t), r); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "etc/hosts")); err != nil || string(b) != "10.88.0.4 clone\n" {
		t.Errorf("hosts file %q %v", b, err)
	}
	cfg := h.net.last()
	if cfg == nil || cfg.MAC.String() != mac.String() || cfg.MTU != 1450 || len(cfg.Addresses) != 2 || cfg.Addresses[1].String() != "fd00::4/64" {
		t.Fatalf("NIC config %+v", cfg)
	}
	want := []string{"<nil> 10.88.0.1 <nil> 10 false", "10.99.0.0/16 <nil> 10.88.0.4 0 false", "<nil> fd00::1 <nil> 0 true"}
	var got []string
	for _, r := range cfg.Routes {
		got = append(got, strings.Join([]string{r.Dst.String(), r.Gateway.String(), r.Source.String(), strconv.Itoa(r.Metric), strconv.FormatBool(r.OnLink)}, " "))
	}
	if !slices.Equal(got, want) {
		t.Errorf("routes %q, want %q", got, want)
	}
	if _, err := c.Init(ctxT(t), agent.InitRequest{}); err != nil || h.net.last() != nil {
		t.Errorf("Init without a network: %v, NIC config %+v, want it taken down", err, h.net.last())
	}
}

// TestInitRootfsThenExec: Init mounts the rootfs (a fake mounter here, so
// the root is a directory the test fills) and every process then runs in
// it, with its rlimits, as the image's user.
func TestInitRootfsThenExec(t *testing.T) {
	testenv.RequireRoot(t) // chroot, credentials
	h := newHarness(t)
	c := h.client(t)
	hello := fillRoot(t, filepath.Join(h.state, "root"), testenv.LookPath(t, "busybox"))
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	_, err := c.Init(ctxT(t), agent.InitRequest{
		Files: []agent.File{{Path: resolv, Data: []byte("nameserver 10.0.0.1\n")}},
		Rootfs: &agent.Rootfs{FSType: "erofs", Serial: "cocoon-rootfs", Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/etc/resolv.conf", Type: "bind", Source: resolv, Options: []string{"rbind", "ro"}},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(h.state, "root")
	h.mnt.mu.Lock()
	mounts := slices.Clone(h.mnt.mounts)
	h.mnt.mu.Unlock()
	for _, m := range []string{root + " overlay", root + "/proc proc", root + "/etc/resolv.conf "} {
		if !slices.Contains(mounts, m) {
			t.Errorf("mounts %q lack %q", mounts, m)
		}
	}
	res := run(t, c, agent.ExecRequest{ID: "hello", Args: []string{"cat", "/data/hello"}}, "")
	if res.stdout != hello || res.status.Code != 0 {
		t.Errorf("cat /data/hello in the container: %q %q %+v, want %q", res.stdout, res.stderr, res.status, hello)
	}
	umask := uint32(0o077)
	res = run(t, c, agent.ExecRequest{
		ID: "limits", Args: []string{"sh", "-c", "id -u; echo $HOME; ulimit -n; umask"}, UID: 1000, GID: 1000,
		Rlimits: []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Soft: 77, Hard: 77}}, Umask: &umask,
	}, "")
	if want := "1000\n/home/app\n77\n0077\n"; res.stdout != want || res.status.Code != 0 {
		t.Errorf("limits in the container: %q %q %+v, want %q", res.stdout, res.stderr, res.status, want)
	}
	_, err = c.Exec(ctxT(t), agent.ExecRequest{ID: "missing", Args: []string{"/usr/bin/env"}})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "not found in the container") {
		t.Errorf("exec of a program the container lacks: %v, want invalid argument", err)
	}
}

// fillRoot makes a small container root: busybox with a few applets, a
// passwd with a user, and a file with random content, which it returns.
func fillRoot(t *testing.T, root, busybox string) string {
	t.Helper()
	for _, d := range []string{"bin", "etc", "data"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	hello := make([]byte, 16)
	_, _ = rand.Read(hello)
	files := map[string]string{
		"bin/busybox": string(b),
		"etc/passwd":  "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n",
		"data/hello":  hex.EncodeToString(hello),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(root, name), []byte(data), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, applet := range []string{"sh", "cat", "id"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	return files["data/hello"]
}

// countingAgent accepts every Init and counts them. Other methods are not
// served.
type countingAgent struct {
	api.AgentService
	inits atomic.Int32
}

func (a *countingAgent) Init(context.Context, *api.InitRequest) (*api.InitResponse, error) {
	a.inits.Add(1)
	return &api.InitResponse{Version: "3"}, nil
}

// TestInitRejectsBadInput: the host refuses what the guest would, before
// sending anything: the agent here accepts anything.
func TestInitRejectsBadInput(t *testing.T) {
	a := &countingAgent{}
	c := serveFake(t, a)
	for _, tc := range []struct {
		name string
		r    agent.InitRequest
		want string
	}{
		{"relative file", agent.InitRequest{Files: []agent.File{{Path: "etc/hosts"}}}, `file "etc/hosts": expected an absolute path`},
		{"device", agent.InitRequest{Files: []agent.File{{Path: "/f", Mode: os.ModeDevice | 0o600}}}, "expected a file, an empty directory's mode or a link"},
		{"directory with data", agent.InitRequest{Files: []agent.File{{Path: "/d", Data: []byte("x"), Mode: os.ModeDir | 0o755}}}, `file "/d": mode d`},
		{"link without target", agent.InitRequest{Files: []agent.File{{Path: "/l", Mode: os.ModeSymlink}}}, `file "/l": mode L`},
		{"id-mapped mount", agent.InitRequest{Rootfs: &agent.Rootfs{FSType: "ext4", Serial: "s", Mounts: []specs.Mount{
			{Destination: "/x", Type: "bind", Source: "/y", UIDMappings: []specs.LinuxIDMapping{{Size: 1}}},
		}}}, "id-mapped mounts are not supported"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Init(ctxT(t), tc.r)
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Init: %v, want invalid argument saying %q", err, tc.want)
			}
			if n := a.inits.Load(); n != 0 {
				t.Fatalf("the host sent %d Init calls, want none", n)
			}
		})
	}
}
