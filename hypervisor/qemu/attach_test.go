package qemu

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// testNet is a network namespace of the test's own with a persistent tap
// in it (IFF_TAP|IFF_NO_PI, no vnet header), as the shim hands one over:
// the tap holds hostIP of a /30 whose other address, guestIP, is the
// guest's. Traffic never leaves the namespace.
type testNet struct {
	// mode and flags of the tap; newTestNet makes it IFF_TAP|IFF_NO_PI.
	mode            netlink.TuntapMode
	flags           netlink.TuntapFlag
	ns              *os.File
	tap             *os.File
	tapName         string
	hostIP, guestIP string
}

func newTestNet(t testing.TB) *testNet {
	t.Helper()
	return newTestNetTap(t, netlink.TUNTAP_MODE_TAP, netlink.TUNTAP_NO_PI)
}

func newTestNetTap(t testing.TB, mode netlink.TuntapMode, flags netlink.TuntapFlag) *testNet {
	t.Helper()
	testenv.RequireRoot(t)
	id := make([]byte, 3)
	rand.Read(id)
	// 10.a.b.(4c+1)/30: unique enough for the tests running at once.
	base := fmt.Sprintf("10.%d.%d.%d", id[0], id[1], id[2]&^3)
	n := &testNet{mode: mode, flags: flags, tapName: "cqt" + hex.EncodeToString(id), hostIP: offsetIP(base, 1), guestIP: offsetIP(base, 2)}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		err = n.setup()
		// Back to our namespace before the thread serves other goroutines,
		// and before the test goes on (the thread may be the main one,
		// whose namespace /proc/PID/ns/net shows); a thread that cannot go
		// back stays locked and ends with this one.
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	err := <-errc
	t.Cleanup(func() {
		for _, f := range []*os.File{n.tap, n.ns} {
			if f != nil {
				f.Close()
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func offsetIP(base string, n int) string {
	i := strings.LastIndexByte(base, '.')
	last, _ := strconv.Atoi(base[i+1:])
	return base[:i+1] + strconv.Itoa(last+n)
}

// setup runs on a locked thread: it moves the thread to a new network
// namespace and makes the tap there.
func (n *testNet) setup() error {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("unshare netns: %w", err)
	}
	ns, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		return err
	}
	n.ns = ns
	tap := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: n.tapName},
		Mode: n.mode, Flags: n.flags, Queues: 1}
	if err := netlink.LinkAdd(tap); err != nil {
		return fmt.Errorf("add tap: %w", err)
	}
	n.tap = tap.Fds[0]
	addr, err := netlink.ParseAddr(n.hostIP + "/30")
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(tap, addr); err != nil {
		return fmt.Errorf("address tap: %w", err)
	}
	return netlink.LinkSetUp(tap)
}

// A tap QEMU would give a vnet header, or a tun device, would change the
// NIC the snapshot's stream describes: the driver refuses it up front.
func TestCheckTap(t *testing.T) {
	tests := []struct {
		name  string
		mode  netlink.TuntapMode
		flags netlink.TuntapFlag
		want  string
	}{
		{"tap, no pi", netlink.TUNTAP_MODE_TAP, netlink.TUNTAP_NO_PI, ""},
		{"vnet header", netlink.TUNTAP_MODE_TAP, netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR, "without IFF_VNET_HDR"},
		{"tun", netlink.TUNTAP_MODE_TUN, netlink.TUNTAP_NO_PI, "want IFF_TAP|IFF_NO_PI"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newTestNetTap(t, tt.mode, tt.flags)
			err := checkTap(n.tap)
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("checkTap = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// QEMU runs in its run directory, so a disk given relative to the shim's
// working directory goes on its command line absolute, naming the file
// that was checked.
func TestRestoreLaunchDiskAbsolute(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rootfs.img"), make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	d := New(config.QEMU{Accel: accelTCG})
	l, _, err := d.restoreLaunch(tcgShape(), hypervisor.RestoreRequest{Disk: "rootfs.img"})
	if err != nil {
		t.Fatal(err)
	}
	if !filepath.IsAbs(l.Disk) {
		t.Fatalf("launch disk %q, want an absolute path", l.Disk)
	}
	got, err := os.Stat(l.Disk)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.Stat(filepath.Join(dir, "rootfs.img"))
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(got, want) {
		t.Errorf("launch disk %q is not %s", l.Disk, filepath.Join(dir, "rootfs.img"))
	}
}

// nic is the NIC a restore gets.
func (n *testNet) nic() *hypervisor.NIC {
	return &hypervisor.NIC{TapName: n.tapName, TapFile: n.tap}
}

// tapRxPackets counts what the VM sent into the tap.
func (n *testNet) tapRxPackets(t testing.TB) uint64 {
	t.Helper()
	h, err := netlink.NewHandleAt(netns.NsHandle(int(n.ns.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(n.tapName)
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().Statistics.RxPackets
}

// sameNetNS reports whether pid runs in the namespace ns.
func sameNetNS(t testing.TB, pid int, ns *os.File) bool {
	t.Helper()
	var a, b unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &a); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fstat(int(ns.Fd()), &b); err != nil {
		t.Fatal(err)
	}
	return a.Dev == b.Dev && a.Ino == b.Ino
}

// hostFeatures are the virtio features QEMU offers the guest for the
// device with qdev id: the migration load refuses a stream whose guest
// features they do not cover.
func hostFeatures(t testing.TB, v *VM, id string) string {
	t.Helper()
	var st struct {
		HostFeatures json.RawMessage `json:"host-features"`
	}
	args := map[string]string{"path": "/machine/peripheral/" + id}
	if err := v.qmp.Execute(testContext(t, 10*time.Second), "x-query-virtio-status", args, &st); err != nil {
		t.Fatalf("x-query-virtio-status %s: %v", id, err)
	}
	return string(st.HostFeatures)
}

// A snapshot baked with no NIC backend restores with a tap, in the task's
// network namespace, and its guest reaches the host side of the tap; the
// same snapshot restores without one, its NIC present and down. QEMU offers
// the same NIC features either way, so one migration stream loads in both.
func TestRestoreNIC(t *testing.T) {
	d := newTestDriver(t)
	s := newStager(t, t.TempDir(), bakedLink(t, d))
	n := newTestNet(t)
	v, c := restoreReady(t, d, hypervisor.RestoreRequest{StagedDir: s.stage(), RunDir: s.runDir(),
		Mode: hypervisor.ModeCopy, NetNS: n.ns, NIC: n.nic()})
	if !sameNetNS(t, v.PID(), n.ns) {
		t.Errorf("qemu %d does not run in the test's network namespace", v.PID())
	}
	if sameNetNS(t, os.Getpid(), n.ns) {
		t.Fatal("the test process itself moved into the VM's network namespace")
	}
	if got := n.tapRxPackets(t); got != 0 {
		t.Errorf("the restored VM sent %d packets with its NIC down (the snapshot's MAC must not be announced)", got)
	}
	run(t, c, "/bin/sh", "-c", fmt.Sprintf("ip link set eth0 up && ip addr add %s/30 dev eth0", n.guestIP))
	run(t, c, "ping", "-c1", "-W10", n.hostIP)
	withTap := hostFeatures(t, v, nicID)

	v2, c2 := restoreReady(t, d, hypervisor.RestoreRequest{StagedDir: s.stage(), RunDir: s.runDir(), Mode: hypervisor.ModeMmap})
	if flags := run(t, c2, "cat", "/sys/class/net/eth0/flags"); flags == "" || mustHex(t, flags)&syscall.IFF_UP != 0 {
		t.Errorf("eth0 flags %q without a NIC backend, want it present and down", flags)
	}
	if without := hostFeatures(t, v2, nicID); without != withTap {
		t.Errorf("virtio-net host features without a backend %s, with a tap %s: want them equal", without, withTap)
	}
}

func mustHex(t testing.TB, s string) int {
	t.Helper()
	v, err := strconv.ParseInt(strings.TrimPrefix(s, "0x"), 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	return int(v)
}

// erofsImage makes a small erofs image holding one file of random text,
// padded to size bytes, and returns its path and the text.
func erofsImage(t testing.TB, size int64) (string, string) {
	t.Helper()
	mkfs := testenv.LookPath(t, "mkfs.erofs")
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	text := rand.Text()
	if err := os.WriteFile(filepath.Join(src, "hello.txt"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(dir, "rootfs.erofs")
	if out, err := exec.Command(mkfs, "--quiet", img, src).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.erofs: %v\n%s", err, out)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	return img, text
}

// diskNamed prints the block device and virtio device of the disk whose
// serial is $1: the guest's driver probed its disks at boot.
const diskNamed = `for b in /sys/block/vd*; do [ "$(cat $b/serial)" = "$1" ] && echo ${b##*/} $(basename $(readlink $b/device)); done; true`

// A snapshot's rootfs slot, an empty node the guest probed at boot,
// restores with an image of another size: the guest keeps the capacity it
// read at boot, which holds the image, and mounts the image read-only
// without probing the slot again. QEMU offers the same block features
// either way.
func TestRestoreDisk(t *testing.T) {
	d := newTestDriver(t)
	s := newStager(t, t.TempDir(), bakedLink(t, d))
	const size = 3<<20 + 4096
	img, text := erofsImage(t, size)
	v, c := restoreReady(t, d, hypervisor.RestoreRequest{StagedDir: s.stage(), RunDir: s.runDir(), Mode: hypervisor.ModeMmap, Disk: img})
	devs := strings.Fields(run(t, c, "/bin/sh", "-c", diskNamed, "sh", rootfsSerial))
	if len(devs) != 2 {
		t.Fatalf("devices with serial %s: %q, want one disk and its virtio device", rootfsSerial, devs)
	}
	dev := devs[0]
	if got := run(t, c, "cat", "/sys/block/"+dev+"/size"); got != strconv.Itoa(emptyCapacity/512) {
		t.Errorf("guest sees %s sectors on %s, want %d (the empty slot's, probed at boot)", got, dev, emptyCapacity/512)
	}
	if got := run(t, c, "cat", "/sys/block/"+dev+"/ro"); got != "1" {
		t.Errorf("%s ro = %s, want 1", dev, got)
	}
	got := run(t, c, "/bin/sh", "-c", "mkdir -p /mnt/rootfs && mount -t erofs -o ro /dev/"+dev+" /mnt/rootfs && cat /mnt/rootfs/hello.txt")
	if got != text {
		t.Errorf("hello.txt in the guest reads %q, want %q", got, text)
	}
	withDisk := hostFeatures(t, v, rootfsID)

	v2, c2 := restoreReady(t, d, hypervisor.RestoreRequest{StagedDir: s.stage(), RunDir: s.runDir(), Mode: hypervisor.ModeCopy})
	if got := run(t, c2, "/bin/sh", "-c", "ls /sys/block | grep -c vd || true"); got != "1" {
		t.Errorf("%s virtio-blk disks after a restore without an image, want the rootfs slot", got)
	}
	if without := hostFeatures(t, v2, rootfsID); without != withDisk {
		t.Errorf("virtio-blk host features with an empty slot %s, with a disk %s: want them equal", without, withDisk)
	}
}

// A VM restored with its rootfs slot empty gets its image later
// (AttachRootfs, a pooled VM's claim): Init, told the image's size, mounts
// it as the container's root and reads the image, not the zeroes the
// guest read of the empty slot. A missing image leaves the slot as it was.
func TestAttachRootfs(t *testing.T) {
	d := newTestDriver(t)
	s := newStager(t, t.TempDir(), bakedLink(t, d))
	v, c := restoreReady(t, d, hypervisor.RestoreRequest{StagedDir: s.stage(), RunDir: s.runDir(), Mode: hypervisor.ModeMmap})
	ctx := testContext(t, time.Minute)
	if err := v.AttachRootfs(ctx, filepath.Join(t.TempDir(), "missing.erofs")); err == nil {
		t.Fatal("attach a missing image: want an error")
	}
	// The guest reads the empty slot first, as a pooled VM's warm-up may.
	run(t, c, "/bin/sh", "-c", `d=$(for b in /sys/block/vd*; do [ "$(cat $b/serial)" = "$1" ] && echo ${b##*/}; done; true); head -c 4096 /dev/$d >/dev/null`, "sh", rootfsSerial)
	img, text := slotImage(t, 8<<20, true)
	if err := v.AttachRootfs(ctx, img); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Init(ctx, agent.InitRequest{Rootfs: &agent.Rootfs{FSType: "erofs", Serial: rootfsSerial, Size: 8 << 20}}); err != nil {
		t.Fatalf("init with the attached rootfs: %v (console %s)", err, readSerial(v))
	}
	if got := run(t, c, "/bin/busybox", "cat", "/hello.txt"); got != text {
		t.Errorf("the container root's hello.txt reads %q, want %q", got, text)
	}
}
