package qemu

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
)

// ShapeFile is the state file that records the machine shape of a snapshot.
const ShapeFile = "qemu.json"

// StateFile is the state file holding the device-state migration stream.
const StateFile = "qemu.state"

// shapeVersion changes whenever the command line this driver builds from a
// Shape changes in a way a migration stream would notice. Version 2 added
// the NIC and the rootfs block slot.
const shapeVersion = 2

// maxShapeBytes bounds qemu.json: it comes from an image, and a real one
// is a few hundred bytes.
const maxShapeBytes = 64 << 10

// devices is the device set every VM gets, in command-line order (virtio-mmio
// slots are handed out in that order, so it is part of the machine). A
// snapshot records it so a restore with a different set fails clearly
// instead of inside the migration stream.
var devices = []string{
	"virtio-serial-device", "virtserialport:" + agentPort,
	"virtio-net-device:" + nicID, "virtio-blk-device:" + rootfsID,
}

// machineDevices is the device set of a VM with slots spare disk slots:
// every VM's, then the slots in order.
func machineDevices(slots int) []string {
	d := slices.Clone(devices)
	for i := range slots {
		d = append(d, "virtio-blk-device:"+diskID(i))
	}
	return d
}

// Shape is qemu.json: everything a restore needs to rebuild the command
// line of the VM a snapshot came from. JSON keys are lowerCamel. Accel and
// CPU say what the snapshot was baked with; a restore runs the host's own
// choice and only checks that they agree.
type Shape struct {
	Version     int      `json:"version"`
	Machine     string   `json:"machine"`
	Accel       string   `json:"accel"`
	CPU         string   `json:"cpu"`
	VCPUs       int      `json:"vcpus"`
	MemoryBytes int64    `json:"memoryBytes"`
	Devices     []string `json:"devices"`
	// DiskSlots is how many spare disk slots the VM has after its rootfs
	// slot; a snapshot made before they existed has none.
	DiskSlots int `json:"diskSlots,omitempty"`
	// Cmdline is the guest kernel command line at cold boot; kept for
	// inspection, a restore does not use it.
	Cmdline string `json:"cmdline"`
}

// Validate rejects a shape this driver cannot rebuild.
func (s Shape) Validate() error {
	switch {
	case s.Version == 1:
		return errors.New("qemu.json version 1: the snapshot predates the NIC and rootfs slots every snapshot now has; re-bake it (cocoonctl bake)")
	case s.Version != shapeVersion:
		return fmt.Errorf("qemu.json version %d: this driver reads version %d", s.Version, shapeVersion)
	case s.Machine != machineType:
		return fmt.Errorf("qemu.json machine %q: this driver builds %q", s.Machine, machineType)
	case s.VCPUs < 1:
		return fmt.Errorf("qemu.json vcpus %d: want at least 1", s.VCPUs)
	case s.MemoryBytes <= 0 || s.MemoryBytes%(1<<20) != 0:
		return fmt.Errorf("qemu.json memoryBytes %d: want a positive multiple of 1 MiB", s.MemoryBytes)
	case s.CPU == "" || s.Accel == "":
		return fmt.Errorf("qemu.json: cpu and accel must be set")
	case s.DiskSlots < 0 || s.DiskSlots > MaxDiskSlots:
		return fmt.Errorf("qemu.json diskSlots %d: want 0 to %d", s.DiskSlots, MaxDiskSlots)
	case !slices.Equal(s.Devices, machineDevices(s.DiskSlots)):
		return fmt.Errorf("qemu.json devices %v: this driver builds %v for %d disk slots", s.Devices, machineDevices(s.DiskSlots), s.DiskSlots)
	}
	return nil
}

// ReadShape reads and validates path.
func ReadShape(path string) (Shape, error) {
	data, err := readBounded(path, maxShapeBytes)
	if err != nil {
		return Shape{}, fmt.Errorf("read machine shape: %w", err)
	}
	var s Shape
	if err := json.Unmarshal(data, &s); err != nil {
		return Shape{}, fmt.Errorf("decode %s: %w", path, err)
	}
	if err := s.Validate(); err != nil {
		return Shape{}, err
	}
	return s, nil
}

// readBounded reads a small file that came from an image: a regular file
// (not a symlink, FIFO or device: opened without following links and
// without blocking) of at most limit bytes.
func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if errors.Is(err, unix.ELOOP) {
		return nil, fmt.Errorf("%s is a symlink: want a regular file", path)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (mode %s)", path, st.Mode())
	}
	if st.Size() > limit {
		return nil, fmt.Errorf("%s is %d bytes: want at most %d", path, st.Size(), limit)
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s grew past %d bytes while read", path, limit)
	}
	return data, nil
}

// WriteShape writes s as dir/qemu.json.
func WriteShape(dir string, s Shape) error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("encode machine shape: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, ShapeFile), append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("write machine shape: %w", err)
	}
	return nil
}
