package server

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

func fullInit(dir string) *api.InitRequest {
	return &api.InitRequest{
		Time:     timestamppb.New(time.Unix(1900000000, 0)),
		Entropy:  []byte("0123456789abcdef"),
		Hostname: "clone-1",
		Sysctls:  map[string]string{"net.ipv4.ping_group_range": "0 2147483647", "kernel/shm_rmid_forced": "1"},
		Files:    []*api.File{{Path: filepath.Join(dir, "etc/resolv.conf"), Data: []byte("nameserver 10.0.0.1\n")}},
		Network:  &api.Network{Mac: "02:00:00:00:00:01", Addresses: []string{"10.0.0.2/24"}},
		Rootfs:   &api.Rootfs{Fstype: "erofs", Serial: "cocoon-rootfs"},
	}
}

// TestInitOrder: identity, sysctls (by name), then files, network,
// rootfs; files exist before the network is configured.
func TestInitOrder(t *testing.T) {
	g := newFakeGuest(t)
	dir := t.TempDir()
	g.net.check = func() string {
		if _, err := os.Stat(filepath.Join(dir, "etc/resolv.conf")); err != nil {
			return "no-files"
		}
		return "files"
	}
	if _, err := g.svc.Init(context.Background(), fullInit(dir)); err != nil {
		t.Fatal(err)
	}
	want := []string{"clock", "entropy", "hostname", "sysctl", "sysctl", "network", "disk", "mount", "mount", "mount"}
	if got := g.j.steps(); !slices.Equal(got, want) {
		t.Errorf("steps %v, want %v", got, want)
	}
	if got := g.j.all()[3:5]; !slices.Equal(got, []string{"sysctl kernel/shm_rmid_forced=1", "sysctl net.ipv4.ping_group_range=0 2147483647"}) {
		t.Errorf("sysctl steps %q, want both, in the order of their names", got)
	}
	if e := g.j.all()[5]; e != "network true files" {
		t.Errorf("network step %q, want it after the files were written", e)
	}
}

// TestInitPhases: Init times the steps it had work for, in order, and
// leaves out the others; a confined root adds its confine step, and a NIC
// that may not be down (no fresh boot, or a process ran) the network step
// that takes it down.
func TestInitPhases(t *testing.T) {
	dir := t.TempDir()
	confined := fullInit(dir)
	confined.Rootfs.MaskedPaths = []string{"/proc/kcore"}
	fresh := []Option{WithFreshBoot()}
	for _, tc := range []struct {
		name string
		opts []Option
		r    *api.InitRequest
		want []string
	}{
		{"identity only", fresh, &api.InitRequest{Hostname: "clone-1"}, []string{api.PhaseIdentity}},
		{"the NIC taken down", nil, &api.InitRequest{Hostname: "clone-1"}, []string{api.PhaseIdentity, api.PhaseNetwork}},
		{"everything", fresh, fullInit(dir), []string{api.PhaseIdentity, api.PhaseSysctls, api.PhaseFiles, api.PhaseNetwork, api.PhaseDisk, api.PhaseRootfs}},
		{"a confined root", fresh, confined, []string{api.PhaseIdentity, api.PhaseSysctls, api.PhaseFiles, api.PhaseNetwork, api.PhaseDisk, api.PhaseRootfs, api.PhaseConfine}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newFakeGuest(t, tc.opts...)
			resp, err := g.svc.Init(context.Background(), tc.r)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range resp.Phases {
				got = append(got, p.Name)
				if p.Nanos < 0 {
					t.Errorf("phase %s took %dns", p.Name, p.Nanos)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("phases %v, want %v", got, tc.want)
			}
		})
	}
}

// TestInitStepFails: a failing step is named, and later steps do not run.
func TestInitStepFails(t *testing.T) {
	for _, step := range []string{"clock", "entropy", "hostname", "sysctl", "files", "network", "rootfs"} {
		t.Run(step, func(t *testing.T) {
			g := newFakeGuest(t)
			boom := errors.New("boom")
			switch step {
			case "network":
				g.net.err = boom
			case "rootfs":
				g.mnt.diskErr = boom
			default:
				g.sys.err = map[string]error{step: boom}
			}
			r := fullInit(t.TempDir())
			if step == "files" {
				// A file where its directory should be.
				parent := filepath.Dir(r.Files[0].Path)
				if err := os.WriteFile(parent, nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			_, err := g.svc.Init(context.Background(), r)
			name := map[string]string{"sysctl": "sysctls"}[step]
			if name == "" {
				name = step
			}
			if (step != "files" && !errors.Is(err, boom)) || err == nil || !strings.HasPrefix(err.Error(), "init "+name+": ") {
				t.Fatalf("Init: %v, want it to name step %s", err, step)
			}
			steps := g.j.steps()
			if last := steps[len(steps)-1]; last != map[string]string{"rootfs": "disk", "files": "sysctl"}[step] && last != step {
				t.Errorf("steps %v went on after %s failed", steps, step)
			}
		})
	}
}

// TestInitRejectsBadInput: bad input fails with a message naming the step
// and the value, and changes nothing.
func TestInitRejectsBadInput(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(r *api.InitRequest)
		want   string
	}{
		{"relative file", func(r *api.InitRequest) { r.Files[0].Path = "etc/hosts" }, "init files: file \"etc/hosts\": expected a clean absolute path"},
		{"unclean file", func(r *api.InitRequest) { r.Files[0].Path = "/etc/../hosts" }, "expected a clean absolute path"},
		{"big file", func(r *api.InitRequest) { r.Files[0].Data = make([]byte, api.MaxFileSize+1) }, "expected at most"},
		{"too many files", func(r *api.InitRequest) {
			r.Files = slices.Repeat(r.Files, api.MaxFiles+1)
		}, "files, expected at most 128"},
		{"piece of a file", func(r *api.InitRequest) { r.Files[0].More = true }, "only UpdateFiles takes files in pieces"},
		{"regular file type bits", func(r *api.InitRequest) { r.Files[0].Mode = 0o100644 }, "expected a file, a directory (040000) or a link (0120000)"},
		{"device", func(r *api.InitRequest) { r.Files[0].Mode = unix.S_IFCHR | 0o666 }, "expected a file, a directory"},
		{"other mode bits", func(r *api.InitRequest) { r.Files[0].Mode = unix.S_ISUID | 0o755 }, "expected a type and permission bits only"},
		{"directory with data", func(r *api.InitRequest) { r.Files[0].Mode = unix.S_IFDIR | 0o755 }, "a directory with"},
		{"link without target", func(r *api.InitRequest) {
			r.Files[0].Mode, r.Files[0].Data = unix.S_IFLNK, nil
		}, "expected a target of 1 to 4095 bytes"},
		{"file under a link", func(r *api.InitRequest) {
			dir := filepath.Dir(r.Files[0].Path)
			r.Files = append(r.Files, &api.File{Path: dir, Mode: unix.S_IFLNK, Data: []byte("/etc")})
		}, "a link made by the same request"},
		{"bad mac", func(r *api.InitRequest) { r.Network.Mac = "zz" }, `init network: mac "zz": expected a unicast Ethernet address`},
		{"multicast mac", func(r *api.InitRequest) { r.Network.Mac = "01:00:5e:00:00:01" }, "unicast"},
		{"bad mtu", func(r *api.InitRequest) { r.Network.Mtu = 20 }, "mtu 20: expected 68..65535"},
		{"bad address", func(r *api.InitRequest) { r.Network.Addresses = []string{"10.0.0.2"} }, `address "10.0.0.2": expected a CIDR`},
		{"bad destination", func(r *api.InitRequest) {
			r.Network.Routes = []*api.Route{{Destination: "x", Gateway: "10.0.0.1"}}
		}, "expected the destination as a CIDR"},
		{"bad gateway", func(r *api.InitRequest) { r.Network.Routes = []*api.Route{{Gateway: "gw"}} }, "expected the gateway as an IP"},
		{"bad source", func(r *api.InitRequest) {
			r.Network.Routes = []*api.Route{{Gateway: "10.0.0.1", Source: "s"}}
		}, `source "s"`},
		{"default without gateway", func(r *api.InitRequest) { r.Network.Routes = []*api.Route{{}} }, "a default route needs a gateway"},
		{"mixed families", func(r *api.InitRequest) {
			r.Network.Routes = []*api.Route{{Destination: "fd00::/64", Gateway: "10.0.0.1"}}
		}, "different families"},
		{"on-link without gateway", func(r *api.InitRequest) {
			r.Network.Routes = []*api.Route{{Destination: "10.1.0.0/16", OnLink: true}}
		}, "on_link needs a gateway"},
		{"bad fstype", func(r *api.InitRequest) { r.Rootfs.Fstype = "xfs" }, `init rootfs: fstype "xfs": expected erofs or ext4`},
		{"bad serial", func(r *api.InitRequest) { r.Rootfs.Serial = "../vda" }, "expected a virtio-blk serial"},
		{"long serial", func(r *api.InitRequest) { r.Rootfs.Serial = strings.Repeat("s", 21) }, "expected a virtio-blk serial"},
		{"relative mount", func(r *api.InitRequest) {
			r.Rootfs.Mounts = []*api.Mount{{Destination: "proc", Type: "proc"}}
		}, "expected an absolute destination"},
		{"relative bind source", func(r *api.InitRequest) {
			r.Rootfs.Mounts = []*api.Mount{{Destination: "/x", Type: "bind", Source: "x"}}
		}, "expected an absolute guest path"},
		{"bad time", func(r *api.InitRequest) { r.Time = &timestamppb.Timestamp{Nanos: -1} }, "init clock:"},
		{"sysctl path", func(r *api.InitRequest) { r.Sysctls["net/../../etc/passwd"] = "x" }, `init sysctls: sysctl "net/../../etc/passwd": expected a name like net.ipv4.ip_forward`},
		{"absolute sysctl", func(r *api.InitRequest) { r.Sysctls["/proc/sys/x"] = "1" }, "expected a name like"},
		{"empty sysctl component", func(r *api.InitRequest) { r.Sysctls["net..x"] = "1" }, "expected a name like"},
		{"big sysctl value", func(r *api.InitRequest) { r.Sysctls["kernel.x"] = strings.Repeat("1", api.MaxSysctlValue+1) }, "expected at most 4096"},
		{"too many sysctls", func(r *api.InitRequest) {
			for i := range api.MaxSysctls {
				r.Sysctls["kernel.x"+strconv.Itoa(i)] = "1"
			}
		}, "sysctls, expected at most 64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newFakeGuest(t)
			r := fullInit(t.TempDir())
			tc.change(r)
			_, err := g.svc.Init(context.Background(), r)
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Init: %v, want invalid argument saying %q", err, tc.want)
			}
			if steps := g.j.steps(); len(steps) > 0 {
				t.Errorf("bad input still did %v", steps)
			}
		})
	}
}

func TestInitUnsupportedMountType(t *testing.T) {
	g := newFakeGuest(t)
	r := fullInit(t.TempDir())
	r.Rootfs.Mounts = []*api.Mount{{Destination: "/data", Type: "nfs", Source: "srv:/x"}}
	_, err := g.svc.Init(context.Background(), r)
	// Not NotImplemented: containerd takes that from a task Create to mean
	// the task API version is unsupported.
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), `mount at "/data": type "nfs" is not supported in the guest, expected bind or one of [cgroup`) {
		t.Errorf("Init: %v, want invalid argument naming the type and the supported ones", err)
	}
	if steps := g.j.steps(); len(steps) > 0 {
		t.Errorf("an unsupported mount still did %v", steps)
	}
}

func TestInitNetwork(t *testing.T) {
	g := newFakeGuest(t)
	r := &api.InitRequest{Network: &api.Network{
		Mac: "02:aa:bb:cc:dd:ee", Mtu: 1450, Addresses: []string{"10.88.0.4/16", "fd00::4/64"},
		Routes: []*api.Route{
			{Gateway: "10.88.0.1", Metric: 100},
			{Gateway: "fd00::1"},
			{Destination: "10.99.0.0/16", Source: "10.88.0.4"},
			{Destination: "10.77.0.0/16", Gateway: "192.168.0.1", OnLink: true},
			{Destination: "0.0.0.0/0"}, // a default route out of the link, no gateway
		},
	}}
	if _, err := g.svc.Init(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	cfg := g.net.got[0]
	if cfg.MAC.String() != "02:aa:bb:cc:dd:ee" || cfg.MTU != 1450 || len(cfg.Addresses) != 2 ||
		cfg.Addresses[0].String() != "10.88.0.4/16" || cfg.Addresses[1].String() != "fd00::4/64" {
		t.Errorf("config %+v", cfg)
	}
	want := []NetRoute{
		{Gateway: net.ParseIP("10.88.0.1"), Metric: 100},
		{Gateway: net.ParseIP("fd00::1")},
		{Dst: cidr(t, "10.99.0.0/16"), Source: net.ParseIP("10.88.0.4")},
		{Dst: cidr(t, "10.77.0.0/16"), Gateway: net.ParseIP("192.168.0.1"), OnLink: true},
		{Dst: cidr(t, "0.0.0.0/0")},
	}
	for i, w := range want {
		got := cfg.Routes[i]
		if got.Dst.String() != w.Dst.String() || !got.Gateway.Equal(w.Gateway) || !got.Source.Equal(w.Source) ||
			got.Metric != w.Metric || got.OnLink != w.OnLink {
			t.Errorf("route %d: %+v, want %+v", i, got, w)
		}
	}
}

func cidr(t *testing.T, s string) *net.IPNet {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestInitWithoutNetwork: no network takes the NIC down; an agent with no
// NIC to manage refuses a network but accepts none.
func TestInitWithoutNetwork(t *testing.T) {
	g := newFakeGuest(t)
	if _, err := g.svc.Init(context.Background(), &api.InitRequest{}); err != nil {
		t.Fatal(err)
	}
	if len(g.net.got) != 1 || g.net.got[0] != nil {
		t.Errorf("configured %v, want the NIC taken down once", g.net.got)
	}
	bare := New(&fakeSystem{j: &journal{}})
	if _, err := bare.Init(context.Background(), &api.InitRequest{}); err != nil {
		t.Errorf("Init without a network on an agent managing no NIC: %v", err)
	}
	_, err := bare.Init(context.Background(), &api.InitRequest{Network: &api.Network{}})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "init network: this agent manages no NIC") {
		t.Errorf("Init with a network on an agent managing no NIC: %v", err)
	}
	_, err = bare.Init(context.Background(), &api.InitRequest{Rootfs: &api.Rootfs{Fstype: "ext4", Serial: "s"}})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "init rootfs: this agent mounts no rootfs") {
		t.Errorf("Init with a rootfs on an agent mounting none: %v", err)
	}
}

func TestInitFiles(t *testing.T) {
	g := newFakeGuest(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "hosts"), []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := &api.InitRequest{Files: []*api.File{
		{Path: filepath.Join(dir, "hosts"), Data: []byte("127.0.0.1 localhost\n")},
		{Path: filepath.Join(dir, "new/dir/hostname"), Data: []byte("clone\n"), Mode: 0o600},
		{Path: filepath.Join(dir, "empty"), Mode: 0o755},
	}}
	if _, err := g.svc.Init(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		name, data string
		mode       os.FileMode
	}{
		{"hosts", "127.0.0.1 localhost\n", 0o644},
		{"new/dir/hostname", "clone\n", 0o600},
		{"empty", "", 0o755},
	} {
		p := filepath.Join(dir, f.name)
		b, err := os.ReadFile(p)
		fi, serr := os.Stat(p)
		if err != nil || serr != nil || string(b) != f.data || fi.Mode().Perm() != f.mode {
			t.Errorf("%s: %q %v mode %v, want %q mode %v", f.name, b, err, fi.Mode(), f.data, f.mode)
		}
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
}

// TestInitLeavesADownNICAlone: Init without a network takes the NIC down
// only when it may not be: unknown at start, after Init gave it a network,
// or once a process was started (it may have configured it).
func TestInitLeavesADownNICAlone(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		opts  []Option
		calls []*api.InitRequest
		want  []bool // the Configure calls, with a network or not
	}{
		{"down since boot", []Option{WithFreshBoot()}, []*api.InitRequest{{}, {}}, nil},
		{"unknown", nil, []*api.InitRequest{{}, {}}, []bool{false}},
		{"after a network", []Option{WithFreshBoot()}, []*api.InitRequest{{Network: &api.Network{}}, {}, {}}, []bool{true, false}},
		{"after a process", []Option{WithFreshBoot()}, []*api.InitRequest{
			{Process: &api.ExecRequest{Id: "p", Args: []string{"true"}, Cwd: "/"}}, {}, {},
		}, []bool{false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newFakeGuest(t, tc.opts...)
			for _, r := range tc.calls {
				if _, err := g.svc.Init(ctx, r); err != nil {
					t.Fatal(err)
				}
			}
			var got []bool
			for _, cfg := range g.net.got {
				got = append(got, cfg != nil)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("configured the NIC %v (with a network or not), want %v", got, tc.want)
			}
		})
	}
}
