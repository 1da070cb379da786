package agent_test

import (
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/internal/vmtest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

const (
	snapshotMAC = "52:54:00:12:34:56"
	cloneMAC    = "02:aa:bb:cc:dd:01"
)

// TestVMNetworkAndRootfs boots the guest with a NIC (on a hub with no other
// port: no traffic leaves it) and an ext4 rootfs disk, then Inits it as the
// shim would: the NIC takes the clone's MAC, addresses and routes, and the
// processes run in the container's root with its mounts.
func TestVMNetworkAndRootfs(t *testing.T) {
	mkfs := testenv.LookPath(t, "mkfs.ext4")
	src := t.TempDir()
	hello := fillRoot(t, src, testenv.LookPath(t, "busybox"))
	image := filepath.Join(t.TempDir(), "rootfs.img")
	if out, err := exec.Command(mkfs, "-q", "-d", src, image, "32M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	vm := vmtest.Start(t, vmtest.Options{NICMAC: snapshotMAC, Disk: image, DiskSerial: "cocoon-rootfs"})
	tg := &target{c: vm.Client(t), dial: vm.Dial}
	requireGuestSupport(t, tg)

	init := cloneInit("/run/cocoon-files/resolv.conf")
	if _, err := tg.c.Init(ctxT(t), init); err != nil {
		t.Fatal(err)
	}
	sh := func(name, script string) result {
		return run(t, tg.c, agent.ExecRequest{ID: procID(t) + "-" + name, Args: []string{"sh", "-c", script}}, "")
	}
	if res := sh("hello", "cat /data/hello"); res.stdout != hello {
		t.Errorf("cat /data/hello in the container: %q %q, want %q", res.stdout, res.stderr, hello)
	}
	link := sh("link", "busybox ip -o link show; busybox ip -o addr show; busybox ip route; busybox ip -6 route")
	words := strings.Join(strings.Fields(link.stdout), " ")
	for _, want := range []string{"link/ether " + cloneMAC, "mtu 1400", "inet 10.88.0.4/16", "inet6 fd00::4/64", "default via 10.88.0.1", "default via fd00::1", "10.99.0.0/16 dev eth0 scope link src 10.88.0.4"} {
		if !strings.Contains(words, want) {
			t.Errorf("the guest's network lacks %q:\n%s%s", want, link.stdout, link.stderr)
		}
	}
	if strings.Contains(link.stdout, snapshotMAC) {
		t.Errorf("the NIC kept the snapshot's MAC:\n%s", link.stdout)
	}
	if res := sh("mounts", "cat /etc/resolv.conf; test -c /dev/null && grep -c ' /sys/fs/cgroup cgroup2 ' /proc/mounts"); res.stdout != "nameserver 10.88.0.1\n1\n" {
		t.Errorf("mounts in the container: %q %q", res.stdout, res.stderr)
	}
	if _, err := tg.c.Init(ctxT(t), init); err != nil {
		t.Errorf("the same Init again: %v", err)
	}
	init.Rootfs.Serial = "other"
	if _, err := tg.c.Init(ctxT(t), init); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Init with another rootfs: %v, want failed precondition", err)
	}
	if _, err := tg.c.Init(ctxT(t), agent.InitRequest{}); err != nil {
		t.Fatal(err)
	}
	res := sh("down", "busybox ip -o link show eth0; busybox ip -o addr show eth0 | busybox grep -v fe80")
	if strings.Contains(res.stdout, "UP") || strings.Contains(res.stdout, "inet") {
		t.Errorf("after an Init without network the NIC is %q, want down and bare", res.stdout)
	}
}

// requireGuestSupport stops t when the guest build cannot take a NIC or a
// rootfs disk (guest/modules lacks virtio_net, virtio_blk — which the agent
// loads on demand — or overlay).
func requireGuestSupport(t *testing.T, tg *target) {
	t.Helper()
	res := run(t, tg.c, agent.ExecRequest{ID: "support", Args: []string{"sh", "-c",
		"test -d /sys/bus/virtio/drivers/virtio_net && test -f /lib/modules/virtio_blk.ko && grep -qw overlay /proc/filesystems"}}, "")
	if res.status.Code != 0 {
		testenv.Unavailable(t, "the guest build lacks virtio_net, virtio_blk or overlay (guest/modules)")
	}
}

// cloneNetwork is the network of a clone in a pod.
func cloneNetwork() *agent.Network {
	mac, _ := net.ParseMAC(cloneMAC)
	dst := ipnet("10.99.0.0/16")
	return &agent.Network{
		MAC: mac, MTU: 1400, Addresses: []net.IPNet{ipnet("10.88.0.4/16"), ipnet("fd00::4/64")},
		Routes: []agent.Route{
			{Gateway: net.ParseIP("10.88.0.1")},
			{Gateway: net.ParseIP("fd00::1")},
			{Dst: &dst, Source: net.ParseIP("10.88.0.4")},
		},
	}
}

// cloneInit is the Init a clone with a network and a rootfs gets.
func cloneInit(resolv string) agent.InitRequest {
	nosuid := []string{"nosuid", "noexec", "nodev"}
	return agent.InitRequest{
		Files:   []agent.File{{Path: resolv, Data: []byte("nameserver 10.88.0.1\n")}},
		Network: cloneNetwork(),
		Rootfs: &agent.Rootfs{FSType: "ext4", Serial: "cocoon-rootfs", Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: nosuid},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: slices.Concat(nosuid, []string{"mode=1777", "size=65536k"})},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: slices.Concat(nosuid, []string{"ro"})},
			{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: slices.Concat(nosuid, []string{"relatime", "ro"})},
			{Destination: "/etc/resolv.conf", Type: "bind", Source: resolv, Options: []string{"rbind", "ro"}},
		}},
	}
}
