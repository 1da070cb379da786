package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// fakeSysfs lays out the parts of /sys and /dev that Disk reads: virtio
// devices (id, bound or not), the virtio_blk driver, block devices with
// serials, and their nodes.
type fakeSysfs struct {
	t        *testing.T
	sys, dev string
}

func newFakeSysfs(t *testing.T, driver bool) *fakeSysfs {
	f := &fakeSysfs{t: t, sys: t.TempDir(), dev: t.TempDir()}
	f.mkdir("bus/virtio/devices")
	f.mkdir("block")
	if driver {
		f.write("bus/virtio/drivers/virtio_blk/bind", "")
	}
	return f
}

func (f *fakeSysfs) mkdir(p string) {
	if err := os.MkdirAll(filepath.Join(f.sys, p), 0o755); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeSysfs) write(p, data string) {
	f.mkdir(filepath.Dir(p))
	if err := os.WriteFile(filepath.Join(f.sys, p), []byte(data), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeSysfs) virtio(name, id string, bound bool) {
	f.write("bus/virtio/devices/"+name+"/device", id+"\n")
	if bound {
		if err := os.Symlink("../../drivers/x", filepath.Join(f.sys, "bus/virtio/devices", name, "driver")); err != nil {
			f.t.Fatal(err)
		}
	}
}

func (f *fakeSysfs) disk(name, serial string) {
	f.write("block/"+name+"/serial", serial+"\n")
	f.write("block/"+name+"/queue/read_ahead_kb", "128\n")
	if err := os.WriteFile(filepath.Join(f.dev, name), nil, 0o600); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeSysfs) bound() string {
	b, err := os.ReadFile(filepath.Join(f.sys, "bus/virtio/drivers/virtio_blk/bind"))
	if err != nil {
		f.t.Fatal(err)
	}
	return string(b)
}

func (f *fakeSysfs) mounts() LinuxMounts {
	return LinuxMounts{Sys: f.sys, Dev: f.dev, Modules: f.t.TempDir(), DiskMap: filepath.Join(f.sys, "disks"), LoadModule: func(*os.File) error {
		return errors.New("no module loading in this test")
	}}
}

// TestDiskBindsAndFinds: only the unbound virtio block device is bound,
// and the disk is found by serial.
func TestDiskBindsAndFinds(t *testing.T) {
	f := newFakeSysfs(t, true)
	f.virtio("virtio0", "0x0003", false) // the console
	f.virtio("virtio1", "0x0002", true)  // a disk already bound
	f.virtio("virtio2", "0x0002", false) // the rootfs slot
	f.disk("vda", "other")
	f.disk("vdb", "cocoon-rootfs")
	dev, err := f.mounts().Disk(context.Background(), "cocoon-rootfs", 0)
	if err != nil {
		t.Fatal(err)
	}
	if dev != filepath.Join(f.dev, "vdb") {
		t.Errorf("disk %s, want vdb", dev)
	}
	if b := f.bound(); b != "virtio2" {
		t.Errorf("bound %q, want only virtio2", b)
	}
}

// TestDiskBindsMapped: with the guest's map of disks, only the device of
// the disk looked for is bound (each bind probes a disk); a serial the map
// lacks binds every unbound disk.
func TestDiskBindsMapped(t *testing.T) {
	// The fake bind file keeps the last write: the first device bound
	// alone, the last of all.
	for _, tc := range []struct{ serial, want string }{
		{"cocoon-disk-1", "virtio1"},
		{"cocoon-rootfs", "virtio2"},
	} {
		t.Run(tc.serial, func(t *testing.T) {
			f := newFakeSysfs(t, true)
			f.virtio("virtio1", "0x0002", false)
			f.virtio("virtio2", "0x0002", false)
			f.write("disks", "cocoon-disk-1 virtio1\ncocoon-disk-2 virtio2\n")
			f.disk("vda", tc.serial)
			if _, err := f.mounts().Disk(context.Background(), tc.serial, 0); err != nil {
				t.Fatal(err)
			}
			if b := f.bound(); b != tc.want {
				t.Errorf("bound %q, want %q", b, tc.want)
			}
		})
	}
}

// TestDiskWaits: a disk that appears after the bind is found, and gets
// the image disks' readahead.
func TestDiskWaits(t *testing.T) {
	f := newFakeSysfs(t, true)
	f.virtio("virtio0", "0x0002", false)
	go func() {
		time.Sleep(30 * time.Millisecond)
		f.disk("vda", "late")
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if dev, err := f.mounts().Disk(ctx, "late", 0); err != nil || dev != filepath.Join(f.dev, "vda") {
		t.Errorf("disk %q %v, want vda", dev, err)
	}
	if ra, err := os.ReadFile(filepath.Join(f.sys, "block/vda/queue/read_ahead_kb")); err != nil || string(ra) != diskReadahead {
		t.Errorf("the disk's readahead %q %v, want %s KiB", ra, err, diskReadahead)
	}
}

// TestDiskOnlyOne: a guest whose one virtio disk has another serial (a
// Firecracker disk's comes from its image file) uses that disk.
func TestDiskOnlyOne(t *testing.T) {
	f := newFakeSysfs(t, true)
	f.virtio("virtio0", "0x0002", false)
	f.disk("vda", "253:0:1234")
	if dev, err := f.mounts().Disk(context.Background(), "cocoon-rootfs", 0); err != nil || dev != filepath.Join(f.dev, "vda") {
		t.Errorf("disk %q %v, want the only one, vda", dev, err)
	}
}

// TestDiskLoadsDriver: a guest without virtio_blk loaded (it loads it on
// demand) loads the module it carries, which binds the slot, and binds
// nothing itself (this fake load leaves the slot unbound, so a bind would
// show).
func TestDiskLoadsDriver(t *testing.T) {
	f := newFakeSysfs(t, false)
	f.virtio("virtio0", "0x0002", false)
	m := f.mounts()
	if err := os.WriteFile(filepath.Join(m.Modules, "virtio_blk.ko"), []byte("module"), 0o644); err != nil {
		t.Fatal(err)
	}
	var loaded []string
	m.LoadModule = func(mod *os.File) error {
		loaded = append(loaded, mod.Name())
		f.write("bus/virtio/drivers/virtio_blk/bind", "")
		f.disk("vda", "cocoon-rootfs")
		return nil
	}
	if dev, err := m.Disk(context.Background(), "cocoon-rootfs", 0); err != nil || dev != filepath.Join(f.dev, "vda") {
		t.Fatalf("disk %q %v, want vda", dev, err)
	}
	if len(loaded) != 1 || loaded[0] != filepath.Join(m.Modules, "virtio_blk.ko") {
		t.Fatalf("loaded %v, want the guest's virtio_blk.ko once", loaded)
	}
	if b := f.bound(); b != "" {
		t.Errorf("bound %q after loading the driver, want nothing", b)
	}
}

func TestDiskErrors(t *testing.T) {
	t.Run("no driver and no module", func(t *testing.T) {
		_, err := newFakeSysfs(t, false).mounts().Disk(context.Background(), "s", 0)
		if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "virtio_blk driver is not loaded") {
			t.Errorf("Disk: %v, want the driver missing", err)
		}
	})
	t.Run("no such serial", func(t *testing.T) {
		f := newFakeSysfs(t, true)
		f.disk("vda", "a")
		f.disk("vdb", "b")
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err := f.mounts().Disk(ctx, "c", 0)
		if !errdefs.IsNotFound(err) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), `serial "c" (disks: vda="a" vdb="b")`) {
			t.Errorf("Disk: %v, want not found listing the disks", err)
		}
	})
}

// diskOn gives block device name a device link to virtio device dev, as
// the kernel does.
func (f *fakeSysfs) diskOn(name, serial, dev string) {
	f.disk(name, serial)
	if err := os.Symlink("../../../"+dev, filepath.Join(f.sys, "block", name, "device")); err != nil {
		f.t.Fatal(err)
	}
}

// unbound is what was last written to virtio_blk's unbind.
func (f *fakeSysfs) unbound() string {
	b, err := os.ReadFile(filepath.Join(f.sys, "bus/virtio/drivers/virtio_blk/unbind"))
	if errors.Is(err, os.ErrNotExist) {
		return ""
	}
	if err != nil {
		f.t.Fatal(err)
	}
	return string(b)
}

// fakeDisks stands in for the block device nodes refresh opens.
type fakeDisks struct {
	capacity uint64
	held     bool
	opened   []string
	flushed  []string
	open     int // nodes open now
}

func (f *fakeDisks) openDisk(node string) (BlockDisk, bool, error) {
	f.opened = append(f.opened, node)
	if f.held {
		return nil, true, nil
	}
	f.open++
	return fakeDisk{f, node}, false, nil
}

type fakeDisk struct {
	f    *fakeDisks
	node string
}

func (d fakeDisk) Capacity() (uint64, error) { return d.f.capacity, nil }
func (d fakeDisk) Flush() error              { d.f.flushed = append(d.f.flushed, d.node); return nil }
func (d fakeDisk) Close() error              { d.f.open--; return nil }

// TestDiskRefreshes: a disk the driver probed before Disk was called may
// have another image behind its slot. One whose capacity holds the image
// keeps it and has its cached blocks dropped; one too small, or an image
// of unknown size, is probed again (unbound and bound); one bound by this
// call, or held (mounted), is used as found. Found by the guest's note
// of its disks or by serial, the same.
func TestDiskRefreshes(t *testing.T) {
	const capacity = 1 << 30
	tests := []struct {
		name            string
		bound, held     bool
		size            uint64
		unbind, rebound string
		flushed         bool
	}{
		{"probed before, image fits", true, false, capacity, "", "", true},
		{"probed before, image larger", true, false, capacity + 512, "virtio6", "virtio6", false},
		{"probed before, size unknown", true, false, 0, "virtio6", "virtio6", false},
		{"probed now", false, false, 4096, "", "virtio6", false},
		{"probed before and mounted", true, true, 4096, "", "", false},
	}
	for _, mapped := range []bool{false, true} {
		for _, tt := range tests {
			t.Run(fmt.Sprintf("%s/mapped=%v", tt.name, mapped), func(t *testing.T) {
				f := newFakeSysfs(t, true)
				f.virtio("virtio2", "0x0002", true)
				f.virtio("virtio6", "0x0002", tt.bound)
				f.diskOn("vda", "cocoon-rootfs", "virtio2")
				f.diskOn("vde", "cocoon-disk-3", "virtio6")
				if mapped {
					f.write("disks", "cocoon-rootfs virtio2\ncocoon-disk-3 virtio6\n")
					if tt.bound {
						f.mkdir("bus/virtio/devices/virtio6/block/vde")
					}
				}
				disks := &fakeDisks{capacity: capacity, held: tt.held}
				m := f.mounts()
				m.OpenDisk = disks.openDisk
				dev, err := m.Disk(context.Background(), "cocoon-disk-3", tt.size)
				if err != nil || dev != filepath.Join(f.dev, "vde") {
					t.Fatalf("disk %q %v, want vde", dev, err)
				}
				if got := f.unbound(); got != tt.unbind {
					t.Errorf("unbound %q, want %q", got, tt.unbind)
				}
				if got := f.bound(); got != tt.rebound {
					t.Errorf("bound %q, want %q", got, tt.rebound)
				}
				if tt.bound && (len(disks.opened) != 1 || disks.opened[0] != dev) {
					t.Errorf("opened %q, want only %s", disks.opened, dev)
				}
				if want := tt.flushed; (len(disks.flushed) == 1 && disks.flushed[0] == dev) != want || len(disks.flushed) > 1 {
					t.Errorf("flushed %q, want %s flushed: %v", disks.flushed, dev, want)
				}
				if disks.open != 0 {
					t.Errorf("%d disks left open", disks.open)
				}
			})
		}
	}
}

// TestDiskMappedReadsNoSerial: a disk the guest's note maps to a bound
// device is found without reading any serial (a request to the device
// each) and without binding anything.
func TestDiskMappedReadsNoSerial(t *testing.T) {
	f := newFakeSysfs(t, true)
	f.virtio("virtio6", "0x0002", true)
	f.write("disks", "cocoon-disk-3 virtio6\n")
	f.mkdir("bus/virtio/devices/virtio6/block/vde")
	if err := os.WriteFile(filepath.Join(f.dev, "vde"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	disks := &fakeDisks{capacity: 1 << 30}
	m := f.mounts()
	m.OpenDisk = disks.openDisk
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if dev, err := m.Disk(ctx, "cocoon-disk-3", 4096); err != nil || dev != filepath.Join(f.dev, "vde") {
		t.Fatalf("disk %q %v, want vde (found by the note; no block device has a serial here)", dev, err)
	}
	if b := f.bound(); b != "" {
		t.Errorf("bound %q, want nothing", b)
	}
}
