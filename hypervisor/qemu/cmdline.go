package qemu

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// ShapeFile is the state file that records the machine shape of a snapshot.
const ShapeFile = "qemu.json"

// StateFile is the state file holding the device-state migration stream.
const StateFile = "qemu.state"

// shapeVersion changes whenever the command line this driver builds from a
// Shape changes in a way a migration stream would notice.
const shapeVersion = 1

// machineType is the only machine this driver builds: the RAM backend id
// must equal its default RAM id, and option ROMs are off so a restore needs
// no kernel file (qboot loads the kernel from fw_cfg at cold boot only).
const (
	machineType = "microvm"
	ramID       = "microvm.ram"
	machineOpts = "x-option-roms=off"
)

// agentPort is the virtio-serial port name the guest agent looks for.
const agentPort = "agent"

// devices is the device set every VM gets, in command-line order. A
// snapshot records it so a restore with a different set fails clearly
// instead of inside the migration stream.
var devices = []string{"virtio-serial-device", "virtserialport:" + agentPort}

// Shape is qemu.json: everything a restore needs to rebuild the command
// line of the VM a snapshot came from. JSON keys are lowerCamel.
type Shape struct {
	Version     int      `json:"version"`
	Machine     string   `json:"machine"`
	Accel       string   `json:"accel"`
	CPU         string   `json:"cpu"`
	VCPUs       int      `json:"vcpus"`
	MemoryBytes int64    `json:"memoryBytes"`
	Devices     []string `json:"devices"`
	// Cmdline is the guest kernel command line at cold boot; kept for
	// inspection, a restore does not use it.
	Cmdline string `json:"cmdline"`
}

// Validate rejects a shape this driver cannot rebuild.
func (s Shape) Validate() error {
	switch {
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
	case !slices.Equal(s.Devices, devices):
		return fmt.Errorf("qemu.json devices %v: this driver builds %v", s.Devices, devices)
	}
	return nil
}

// ReadShape reads and validates path.
func ReadShape(path string) (Shape, error) {
	data, err := os.ReadFile(path)
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

// memory is the guest RAM backend: a file QEMU maps shared (writes reach
// the file, and x-ignore-shared leaves it out of the migration stream) or
// private (copy-on-write over the file).
type memory struct {
	Path  string
	Share bool
}

// launch is one QEMU command line.
type launch struct {
	Shape  Shape
	Memory memory
	// Kernel, Initrd are set for a cold boot and empty for a restore.
	Kernel, Initrd string
	// QMPFD is the child's fd number of the QMP listening socket.
	QMPFD     int
	AgentSock string
	SerialLog string
	// Incoming starts the VM paused, waiting for migrate-incoming.
	Incoming bool
}

// args builds the command line, without the binary.
func (l launch) args() []string {
	s := l.Shape
	mem := strconv.FormatInt(s.MemoryBytes>>20, 10) + "M"
	a := []string{
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-machine", s.Machine + "," + machineOpts + ",memory-backend=" + ramID,
		"-accel", s.Accel,
		"-cpu", s.CPU,
		"-smp", strconv.Itoa(s.VCPUs),
		"-m", mem,
		"-object", "memory-backend-file,id=" + ramID + ",size=" + mem +
			",mem-path=" + chardevEscape(l.Memory.Path) + ",share=" + onOff(l.Memory.Share),
		"-chardev", "socket,id=qmp,fd=" + strconv.Itoa(l.QMPFD) + ",server=on,wait=off",
		"-mon", "chardev=qmp,mode=control",
		"-chardev", "file,id=serial,path=" + chardevEscape(l.SerialLog),
		"-serial", "chardev:serial",
		"-device", "virtio-serial-device",
		"-chardev", "socket,id=agent,path=" + chardevEscape(l.AgentSock) + ",server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name=" + agentPort,
	}
	if l.Kernel != "" {
		a = append(a, "-kernel", l.Kernel, "-append", s.Cmdline)
		if l.Initrd != "" {
			a = append(a, "-initrd", l.Initrd)
		}
	}
	if l.Incoming {
		a = append(a, "-S", "-incoming", "defer")
	}
	return a
}

// chardevEscape doubles commas, QEMU's escape inside option values.
func chardevEscape(s string) string {
	return strings.ReplaceAll(s, ",", ",,")
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
