package agent_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/internal/vmtest"
)

// runcBundle is where testGuestRunc lays out its bundle, in the guest's
// /tmp (a tmpfs, so the bundle is not on the initramfs's root).
const runcBundle = "/tmp/runc-bundle"

// TestVMRunc boots the real guest and runs a container with the runc its
// initramfs carries: the kernel and runc together give the container its
// namespaces, no capabilities, no_new_privs, a seccomp filter that acts, a
// read-only root and a cgroup whose memory and pids limits hold; and a
// container with CAP_NET_ADMIN can make a bridge.
func TestVMRunc(t *testing.T) {
	vm := vmtest.Boot(t)
	c := vm.Client(t)
	t.Cleanup(func() { _ = c.Close() })
	t.Run("Version", func(t *testing.T) { testRuncVersion(t, c) })
	t.Run("Features", func(t *testing.T) { testRuncFeatures(t, c) })
	t.Run("Cgroup", func(t *testing.T) { testGuestCgroup(t, c) })
	t.Run("Run", func(t *testing.T) { testRuncRun(t, c) })
	t.Run("Bridge", func(t *testing.T) { testRuncBridge(t, c) })
}

// guestShN numbers guestSh's processes: a process ID is the agent's key.
var guestShN atomic.Int64

// guestSh runs script with sh -c in the guest's root and returns its
// stdout, failing t unless it exits 0.
func guestSh(t *testing.T, c *agent.Client, script, stdin string) string {
	t.Helper()
	id := procID(t) + "-" + strconv.FormatInt(guestShN.Add(1), 10)
	res := run(t, c, agent.ExecRequest{ID: id, Args: []string{"sh", "-c", script}, Stdin: stdin != ""}, stdin)
	if res.status.Code != 0 {
		t.Fatalf("%s: exit %+v\nstdout: %s\nstderr: %s", script, res.status, res.stdout, res.stderr)
	}
	return res.stdout
}

func testRuncVersion(t *testing.T, c *agent.Client) {
	out := guestSh(t, c, "runc --version", "")
	info := buildInfo(t)
	for _, want := range []string{"runc version " + info["runc.version"] + "\n", "libseccomp: " + info["runc.libseccomp"] + "\n"} {
		if info["runc.version"] == "" || !strings.Contains(out, want) {
			t.Errorf("runc --version: %q, want it to hold %q (BUILDINFO's)", out, want)
		}
	}
}

// testRuncFeatures: runc finds seccomp and cgroup v2 in the guest.
func testRuncFeatures(t *testing.T, c *agent.Client) {
	var f struct {
		Linux struct {
			Namespaces []string `json:"namespaces"`
			Cgroup     struct {
				V2 bool `json:"v2"`
			} `json:"cgroup"`
			Seccomp struct {
				Enabled bool     `json:"enabled"`
				Actions []string `json:"actions"`
			} `json:"seccomp"`
		} `json:"linux"`
	}
	out := guestSh(t, c, "runc features", "")
	if err := json.Unmarshal([]byte(out), &f); err != nil {
		t.Fatalf("runc features: %v\n%s", err, out)
	}
	if !f.Linux.Seccomp.Enabled || !f.Linux.Cgroup.V2 || len(f.Linux.Seccomp.Actions) == 0 {
		t.Errorf("runc features: seccomp %+v, cgroup v2 %v; want seccomp enabled with actions, and cgroup v2", f.Linux.Seccomp, f.Linux.Cgroup.V2)
	}
	for _, ns := range []string{"pid", "mount", "ipc", "uts", "network", "cgroup"} {
		if !strings.Contains(" "+strings.Join(f.Linux.Namespaces, " ")+" ", " "+ns+" ") {
			t.Errorf("runc features: namespaces %v lack %s", f.Linux.Namespaces, ns)
		}
	}
}

// testGuestCgroup: the boot mounted cgroup v2 with nsdelegate and gave the
// root's children the controllers runc sets limits with.
func testGuestCgroup(t *testing.T, c *agent.Client) {
	mounts := guestSh(t, c, "grep ' /sys/fs/cgroup ' /proc/mounts", "")
	if f := strings.Fields(mounts); len(f) < 4 || f[2] != "cgroup2" || !strings.Contains(","+f[3]+",", ",nsdelegate,") {
		t.Errorf("/sys/fs/cgroup: %q, want cgroup2 mounted with nsdelegate", mounts)
	}
	enabled := " " + strings.TrimSpace(guestSh(t, c, "cat /sys/fs/cgroup/cgroup.subtree_control", "")) + " "
	for _, ctl := range []string{"cpu", "cpuset", "io", "memory", "pids"} {
		if !strings.Contains(enabled, " "+ctl+" ") {
			t.Errorf("root cgroup.subtree_control %q lacks %s", enabled, ctl)
		}
	}
}

// runcScript is the container's process: what confines it, then what it
// may not do.
const runcScript = `grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status
echo "pid=$$ hostname=$(hostname)"
echo "memory.max=$(cat /sys/fs/cgroup/memory.max) pids.max=$(cat /sys/fs/cgroup/pids.max)"
touch /probe 2>/dev/null || echo "root read-only"
mkdir /tmp/probe 2>&1 | grep -q 'not supported' && echo "mkdir refused by seccomp"
[ -c /proc/kcore ] && echo "/proc/kcore masked"
`

// testRuncRun runs runcScript with runc run in a bundle of the guest's own
// busybox, every capability dropped, no_new_privs, a seccomp profile that
// fails mkdir with EOPNOTSUPP, a read-only root and memory and pids limits.
func testRuncRun(t *testing.T, c *agent.Client) {
	layRuncBundle(t, c, runcSpec())
	got := guestSh(t, c, "runc --root /run/runc run --bundle "+runcBundle+" runc-test </dev/null", "")
	t.Logf("the container printed:\n%s", got)
	for _, want := range []string{
		"CapPrm:\t0000000000000000", "CapEff:\t0000000000000000", "CapBnd:\t0000000000000000",
		"NoNewPrivs:\t1", "Seccomp:\t2",
		"pid=1 hostname=runc-test",
		"memory.max=33554432 pids.max=64",
		"root read-only", "mkdir refused by seccomp", "/proc/kcore masked",
	} {
		if !strings.Contains(got, want+"\n") {
			t.Errorf("the container printed\n%s\nwant a line %q", got, want)
		}
	}
	if left := guestSh(t, c, "runc --root /run/runc list -q; ls /sys/fs/cgroup | grep -c runc-test || true", ""); left != "0\n" {
		t.Errorf("after runc run: containers and cgroups left %q", left)
	}
}

// layRuncBundle lays out runcBundle with the guest's own busybox as the
// root and spec as config.json; the bundle goes when t ends.
func layRuncBundle(t *testing.T, c *agent.Client, spec *specs.Spec) {
	config, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	guestSh(t, c, "rm -rf "+runcBundle+" && mkdir -p "+runcBundle+"/rootfs/bin && cd "+runcBundle+
		" && cp /bin/busybox rootfs/bin/ && for a in $(busybox --list); do ln -s busybox rootfs/bin/$a; done && cat >config.json", string(config))
	t.Cleanup(func() { guestSh(t, c, "rm -rf "+runcBundle, "") })
}

// bridgeScript makes a bridge and deletes it, in the container's own
// network namespace; brctl's error, if any, goes to stdout.
const bridgeScript = `if brctl addbr cocoon0 2>&1; then brctl delbr cocoon0 && echo made; fi; exit 0`

// testRuncBridge: a container with CAP_NET_ADMIN makes a bridge (critest's
// Privileged and adding-capability specs run brctl addbr), which needs the
// bridge module loaded at boot; one without it is refused by the bridge
// code itself (EPERM, where a guest without the module gives ENOPKG).
func testRuncBridge(t *testing.T, c *agent.Client) {
	for _, tc := range []struct {
		name, want string
		caps       []string
	}{
		{"net-admin", "made\n", []string{"CAP_NET_ADMIN"}},
		{"no-caps", "Operation not permitted", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "bridge-" + tc.name
			spec := runcSpec()
			spec.Hostname, spec.Linux.CgroupsPath = id, "/"+id
			spec.Process.Args = []string{"/bin/sh", "-c", bridgeScript}
			spec.Process.Capabilities = &specs.LinuxCapabilities{Bounding: tc.caps, Effective: tc.caps, Permitted: tc.caps}
			layRuncBundle(t, c, spec)
			if got := guestSh(t, c, "runc --root /run/runc run --bundle "+runcBundle+" "+id+" </dev/null", ""); !strings.Contains(got, tc.want) {
				t.Errorf("brctl addbr with capabilities %v printed %q, want it to hold %q", tc.caps, got, tc.want)
			}
			if left := guestSh(t, c, "runc --root /run/runc list -q; ls /sys/fs/cgroup | grep -c "+id+" || true", ""); left != "0\n" {
				t.Errorf("after runc run: containers and cgroups left %q", left)
			}
		})
	}
}

func runcSpec() *specs.Spec {
	memory, pids := int64(32<<20), int64(64)
	ro := []string{"nosuid", "noexec", "nodev", "ro"}
	return &specs.Spec{
		Version:  specs.Version,
		Root:     &specs.Root{Path: "rootfs", Readonly: true},
		Hostname: "runc-test",
		Process: &specs.Process{
			Args: []string{"/bin/sh", "-c", runcScript}, Cwd: "/",
			Env:             []string{"PATH=/bin"},
			Capabilities:    &specs.LinuxCapabilities{},
			NoNewPrivileges: true,
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: ro},
			{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: ro},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: "/runc-test",
			Resources:   &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &memory}, Pids: &specs.LinuxPids{Limit: &pids}},
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.MountNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.CgroupNamespace},
			},
			MaskedPaths:   []string{"/proc/keys", "/proc/kcore"},
			ReadonlyPaths: []string{"/proc/sys"},
			Seccomp:       runcSeccomp(),
		},
	}
}

// runcSeccomp allows everything but mkdir and mkdirat, which fail with
// EOPNOTSUPP: an errno nothing else gives them here.
func runcSeccomp() *specs.LinuxSeccomp {
	errno := uint(95)
	return &specs.LinuxSeccomp{
		DefaultAction: specs.ActAllow,
		Architectures: []specs.Arch{specs.ArchX86_64},
		Syscalls:      []specs.LinuxSyscall{{Names: []string{"mkdir", "mkdirat"}, Action: specs.ActErrno, ErrnoRet: &errno}},
	}
}
