package qemu

import (
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// testDiskSlots is the slot count of the guest bakedSlots bakes.
const testDiskSlots = 8

// bakedWithSlots is the project's guest baked with testDiskSlots spare
// disk slots, once per test binary.
var bakedWithSlots struct {
	once sync.Once
	dir  string
	link string
	err  error
}

func bakedSlotsLink(t testing.TB, d *Driver) string {
	t.Helper()
	testenv.Guest(t)
	b := &bakedWithSlots
	b.once.Do(func() {
		if b.dir, b.err = os.MkdirTemp("", "qemu-baked-slots-"); b.err != nil {
			return
		}
		b.link, b.err = bakeGuest(d, b.dir, testMemory, testDiskSlots)
	})
	if b.err != nil {
		t.Fatalf("bake with %d disk slots: %v", testDiskSlots, b.err)
	}
	return b.link
}

// slotImage makes an erofs image of size bytes holding hello.txt, a random
// text it returns, and, with shell, a static busybox at /bin/busybox for
// processes to run in it as their root.
func slotImage(t testing.TB, size int64, shell bool) (string, string) {
	t.Helper()
	mkfs := testenv.LookPath(t, "mkfs.erofs")
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(filepath.Join(src, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	text := rand.Text()
	if err := os.WriteFile(filepath.Join(src, "hello.txt"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if shell {
		bb, err := os.ReadFile(testenv.LookPath(t, "busybox"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, "bin/busybox"), bb, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	img := filepath.Join(dir, "slot.erofs")
	if out, err := exec.Command(mkfs, "--quiet", img, src).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.erofs: %v\n%s", err, out)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	return img, text
}

// reprobeSlot is what the agent's Disk does to a disk the driver probed
// before the host swapped its backend: unbind and bind virtio device $1.
const reprobeSlot = `echo $1 > /sys/bus/virtio/drivers/virtio_blk/unbind && echo $1 > /sys/bus/virtio/drivers/virtio_blk/bind`

// readSlot mounts disk $1 and prints its hello.txt.
const readSlot = `mkdir -p /mnt/slot && mount -t erofs -o ro /dev/$1 /mnt/slot && cat /mnt/slot/hello.txt; umount /mnt/slot`

// TestAttachDiskGuestReads restores a snapshot baked with spare disk slots
// whose guest probed them empty at boot, attaches images of other sizes to
// a slot while the guest runs, detaching between them, and reads each
// through the slot's device once the guest probes it again: 1 TiB empty,
// then 64 MiB, then 1 MiB, then 8 MiB mounted as a container root by the
// agent's Init, whose Disk probes the disk again itself, told the image is
// larger than the 1 MiB the guest sees (busybox, 2 MB, would read past the
// disk's end).
func TestAttachDiskGuestReads(t *testing.T) {
	d := newTestDriver(t)
	s := newStager(t, t.TempDir(), bakedSlotsLink(t, d))
	v, c := restoreReady(t, d, hypervisor.RestoreRequest{StagedDir: s.stage(), RunDir: s.runDir(), Mode: hypervisor.ModeMmap})
	if got := v.DiskSlots(); got != testDiskSlots {
		t.Fatalf("restored VM has %d disk slots, want %d", got, testDiskSlots)
	}
	const slot = 3
	devs := strings.Fields(run(t, c, "/bin/sh", "-c", diskNamed, "sh", diskSerial(slot)))
	if len(devs) != 2 {
		t.Fatalf("devices with serial %s: %q, want one disk and its virtio device", diskSerial(slot), devs)
	}
	disk, virtio := devs[0], devs[1]
	size := func() string { return run(t, c, "cat", "/sys/block/"+disk+"/size") }
	if got, want := size(), strconv.Itoa(emptyCapacity/512); got != want {
		t.Fatalf("empty slot %s has %s sectors, want %s, the capacity the guest probed at boot", disk, got, want)
	}
	ctx := testContext(t, time.Minute)
	for i, bytes := range []int64{64 << 20, 1 << 20} {
		img, text := slotImage(t, bytes, false)
		if i > 0 {
			if err := v.DetachDisk(ctx, slot); err != nil {
				t.Fatal(err)
			}
		}
		serial, err := v.AttachDisk(ctx, slot, img)
		if err != nil {
			t.Fatal(err)
		}
		if serial != diskSerial(slot) {
			t.Errorf("serial %q, want %q", serial, diskSerial(slot))
		}
		t.Logf("%s after attaching %d bytes, before the guest probes it again: %s sectors", disk, bytes, size())
		run(t, c, "/bin/sh", "-c", reprobeSlot, "sh", virtio)
		if got, want := size(), strconv.FormatInt(bytes/512, 10); got != want {
			t.Errorf("%s has %s sectors after the probe, want %s", disk, got, want)
		}
		if got := run(t, c, "/bin/sh", "-c", readSlot, "sh", disk); got != text {
			t.Errorf("hello.txt on %s reads %q, want %q (image %d)", disk, got, text, i)
		}
	}
	if err := v.DetachDisk(ctx, slot); err != nil {
		t.Fatal(err)
	}
	img, text := slotImage(t, 8<<20, true)
	serial, err := v.AttachDisk(ctx, slot, img)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Init(ctx, agent.InitRequest{Rootfs: &agent.Rootfs{FSType: "erofs", Serial: serial, Size: 8 << 20}}); err != nil {
		t.Fatalf("init with the rootfs of slot %d: %v (console %s)", slot, err, readSerial(v))
	}
	if got := run(t, c, "/bin/busybox", "cat", "/hello.txt"); got != text {
		t.Errorf("the container root's hello.txt reads %q, want %q", got, text)
	}
}
