package server

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/ocimount"
)

const (
	// virtioBlockID is the virtio device id of a block device.
	virtioBlockID = "0x0002"
	// diskPoll is the longest pause between looks for the disk; binding is
	// synchronous, so the first look normally finds it.
	diskPoll = 50 * time.Millisecond
)

// binding serialises changes to virtio_blk's bindings: they are the
// guest's one state, and containers joining a pod's VM at once look for
// their disks at once (a bind of a device another call just unbound to
// probe it again fails with EBUSY).
var binding sync.Mutex

// LinuxMounts is the Mounter of the guest the agent runs in; it mounts,
// unmounts and makes nodes as ocimount.System does.
type LinuxMounts struct {
	ocimount.System
	Sys     string // sysfs; empty means /sys
	Dev     string // devtmpfs; empty means /dev
	Modules string // the guest's kernel modules; empty means /lib/modules
	// LoadModule loads the kernel module in f; nil means finit_module(2).
	LoadModule func(f *os.File) error
	// OpenDisk opens a block device node exclusively, or says that
	// something holds it (mounts it); nil means openDisk.
	OpenDisk func(node string) (d BlockDisk, held bool, err error)
	// DiskMap is where the guest's rcS noted at boot each disk's serial
	// and virtio device ("serial virtioN" lines); empty means
	// /run/cocoon/disks.
	DiskMap string
}

func (l LinuxMounts) sys() string     { return orDefault(l.Sys, "/sys") }
func (l LinuxMounts) dev() string     { return orDefault(l.Dev, "/dev") }
func (l LinuxMounts) modules() string { return orDefault(l.Modules, "/lib/modules") }
func (l LinuxMounts) diskMap() string { return orDefault(l.DiskMap, "/run/cocoon/disks") }

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// Disk returns the node of the disk whose serial is serial, binding its
// virtio device if it has no driver and looking again with a growing
// pause until ctx ends. A disk the driver probed before this call (at
// boot: a snapshot carries its slots probed), and that nothing holds
// (mounts it), may have another image behind its slot since: the rootfs
// slot after a restore, a spare slot for a container joining the VM. The
// guest learns a disk's size only when the driver probes it, so a disk
// whose capacity holds the image's size bytes keeps it and only drops the
// blocks it cached; any other is probed again, which under TCG costs
// ~100 ms of a restored VM's first probe (the driver's code translated
// afresh). Under TCG all code a restored VM runs is translated afresh, so
// a disk the guest's note maps to a bound device is taken as found: no
// serial is read (each read is a request to the device), no device bound.
func (l LinuxMounts) Disk(ctx context.Context, serial string, size uint64) (string, error) {
	node, err := l.disk(ctx, serial, size)
	if err == nil {
		l.readahead(ctx, filepath.Base(node))
	}
	return node, err
}

// diskReadahead is an image disk's readahead, in KiB: a first exec then
// faults a whole binary in with a read or two, where under TCG each of
// the default 128 KiB reads is a round trip to the device.
const diskReadahead = "4096"

// readahead sets the readahead of the disk name; a disk without one is
// read as it was.
func (l LinuxMounts) readahead(ctx context.Context, name string) {
	p := filepath.Join(l.sys(), "block", name, "queue", "read_ahead_kb")
	if err := os.WriteFile(p, []byte(diskReadahead), 0); err != nil {
		log.G(ctx).WithError(err).WithField("disk", name).Info("the disk keeps its readahead")
	}
}

// disk is Disk but for the readahead.
func (l LinuxMounts) disk(ctx context.Context, serial string, size uint64) (string, error) {
	fresh := &probed{}
	if dev, name := l.mappedBound(serial); name != "" {
		again, err := l.refresh(dev, name, size)
		if err != nil || !again {
			return filepath.Join(l.dev(), name), err
		}
		fresh.add(dev)
	} else {
		bound, err := l.bindVirtioBlk(serial)
		if err != nil {
			return "", err
		}
		fresh = bound
	}
	return l.find(ctx, serial, size, fresh)
}

// find looks for the disk whose serial is serial until ctx ends, and
// refreshes it unless its device is in fresh.
func (l LinuxMounts) find(ctx context.Context, serial string, size uint64, fresh *probed) (string, error) {
	for pause := time.Millisecond; ; pause = min(2*pause, diskPoll) {
		name, seen, err := l.findSerial(serial)
		if err != nil {
			return "", err
		}
		if name != "" {
			node := filepath.Join(l.dev(), name)
			if _, err := os.Stat(node); err == nil {
				// A disk whose virtio device cannot be named is used as found.
				dev, err := l.virtioDevice(name)
				if err != nil || fresh.has(dev) {
					return node, nil
				}
				if again, err := l.refresh(dev, name, size); err != nil || !again {
					return node, err
				}
				fresh.add(dev)
				continue
			}
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", fmt.Errorf("no virtio-blk disk with serial %q (disks: %s): %w", serial, seen, errors.Join(ctx.Err(), errdefs.ErrNotFound))
		case <-t.C:
		}
	}
}

// mappedBound is the virtio device the guest's note (DiskMap) maps serial
// to and its block device's name, when the device is bound and its node
// is there; else "", "".
func (l LinuxMounts) mappedBound(serial string) (dev, name string) {
	devs := l.mappedDisk(serial)
	if len(devs) != 1 {
		return "", ""
	}
	entries, err := os.ReadDir(filepath.Join(l.sys(), "bus/virtio/devices", devs[0], "block"))
	if err != nil || len(entries) != 1 {
		return "", ""
	}
	if _, err := os.Stat(filepath.Join(l.dev(), entries[0].Name())); err != nil {
		return "", ""
	}
	return devs[0], entries[0].Name()
}

// probed is the virtio devices the driver probed during one Disk call;
// all when it loaded the driver.
type probed struct {
	all  bool
	devs map[string]bool
}

func (p *probed) has(dev string) bool { return p.all || p.devs[dev] }

func (p *probed) add(dev string) {
	if p.devs == nil {
		p.devs = map[string]bool{}
	}
	p.devs[dev] = true
}

// virtioDevice names the virtio device (virtioN) of block device name.
func (l LinuxMounts) virtioDevice(name string) (string, error) {
	dev, err := os.Readlink(filepath.Join(l.sys(), "block", name, "device"))
	if err != nil {
		return "", fmt.Errorf("find the virtio device of %s: %w", name, err)
	}
	return filepath.Base(dev), nil
}

// bindVirtioBlk binds the virtio block device of the disk whose serial is
// serial if it has no driver (a probe that failed left it so), found by
// the guest's note (DiskMap), else every one without a driver, and
// returns those it bound: each bind probes a disk, and a pod's VM has a
// slot per container. A guest without virtio_blk loaded at boot loads it
// here, which probes, and so binds, every slot.
func (l LinuxMounts) bindVirtioBlk(serial string) (*probed, error) {
	binding.Lock()
	defer binding.Unlock()
	driver := filepath.Join(l.sys(), "bus/virtio/drivers/virtio_blk")
	if _, err := os.Stat(driver); errors.Is(err, fs.ErrNotExist) {
		return &probed{all: true}, l.loadVirtioBlk()
	}
	devs, err := l.unboundDisks(serial)
	if err != nil {
		return nil, err
	}
	p := &probed{}
	for _, dev := range devs {
		if err := os.WriteFile(filepath.Join(driver, "bind"), []byte(dev), 0); err != nil {
			return nil, fmt.Errorf("bind %s to virtio_blk: %w", dev, err)
		}
		p.add(dev)
	}
	return p, nil
}

// unboundDisks are the virtio block devices without a driver: the one
// DiskMap names for serial, when it does, else all.
func (l LinuxMounts) unboundDisks(serial string) ([]string, error) {
	devices := filepath.Join(l.sys(), "bus/virtio/devices")
	names := l.mappedDisk(serial)
	if names == nil {
		entries, err := os.ReadDir(devices)
		if err != nil {
			return nil, fmt.Errorf("list virtio devices: %w", err)
		}
		for _, e := range entries {
			names = append(names, e.Name())
		}
	}
	var out []string
	for _, name := range names {
		dir := filepath.Join(devices, name)
		id, err := os.ReadFile(filepath.Join(dir, "device"))
		if err != nil || strings.TrimSpace(string(id)) != virtioBlockID {
			continue
		}
		if _, err := os.Lstat(filepath.Join(dir, "driver")); err == nil {
			continue
		}
		out = append(out, name)
	}
	return out, nil
}

// mappedDisk is the virtio device DiskMap names for serial, or nil.
func (l LinuxMounts) mappedDisk(serial string) []string {
	data, err := os.ReadFile(l.diskMap())
	if err != nil {
		return nil
	}
	for line := range strings.Lines(string(data)) {
		if f := strings.Fields(line); len(f) == 2 && f[0] == serial && filepath.Base(f[1]) == f[1] {
			return []string{f[1]}
		}
	}
	return nil
}

// loadVirtioBlk loads the virtio_blk module the guest carries.
func (l LinuxMounts) loadVirtioBlk() error {
	path := filepath.Join(l.modules(), "virtio_blk.ko")
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("the virtio_blk driver is not loaded in the guest and %s is missing: %w", path, errdefs.ErrFailedPrecondition)
	} else if err != nil {
		return fmt.Errorf("open module: %w", err)
	}
	defer f.Close()
	load := l.LoadModule
	if load == nil {
		load = finitModule
	}
	if err := load(f); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("load %s: %w", path, err)
	}
	return nil
}

func finitModule(f *os.File) error {
	return unix.FinitModule(int(f.Fd()), "", 0)
}

// findSerial returns the block device whose serial is serial, or "" and
// the serials it saw. When no disk has it and the guest has exactly one
// virtio disk, that is the one: Firecracker cannot set a disk's serial (it
// derives it from the image file), and a cocoon VM has one disk slot.
func (l LinuxMounts) findSerial(serial string) (name, seen string, err error) {
	block := filepath.Join(l.sys(), "block")
	entries, err := os.ReadDir(block)
	if err != nil {
		return "", "", fmt.Errorf("list block devices: %w", err)
	}
	var all, virtio []string
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(block, e.Name(), "serial"))
		if err != nil {
			continue // not a disk with a serial (a loop device, a ram disk)
		}
		got := strings.TrimSpace(string(b))
		if got == serial {
			return e.Name(), "", nil
		}
		all = append(all, fmt.Sprintf("%s=%q", e.Name(), got))
		if strings.HasPrefix(e.Name(), "vd") {
			virtio = append(virtio, e.Name())
		}
	}
	if len(virtio) == 1 {
		return virtio[0], "", nil
	}
	sort.Strings(all)
	if len(all) == 0 {
		return "", "none", nil
	}
	return "", strings.Join(all, " "), nil
}
