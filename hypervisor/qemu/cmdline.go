package qemu

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

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

// The NIC every VM has. Its backend is chosen at each start: a tap, or
// none (the guest keeps it down). Its MAC is the same in every snapshot;
// the guest takes its task's MAC after a restore.
const (
	nicID       = "net0"
	snapshotMAC = "02:c0:c0:00:00:01"
)

// The rootfs block slot every VM has. Its backend is chosen at each start:
// a read-only image, or an empty null-co node (emptyDisk). The guest finds
// the slot by its serial.
const (
	rootfsID     = "rootfs"
	rootfsSerial = hypervisor.RootfsSerial
)

// memory is the guest RAM backend: a file QEMU maps shared (writes reach
// the file, and x-ignore-shared leaves it out of the migration stream) or
// private (copy-on-write over the file).
type memory struct {
	Path  string
	Share bool
}

// launch is one QEMU command line.
type launch struct {
	Shape Shape
	// Accel and CPU are the host's: the driver's config or probe, never
	// the strings a snapshot recorded.
	Accel, CPU string
	Memory     memory
	// Kernel, Initrd are set for a cold boot and empty for a restore.
	Kernel, Initrd string
	// QMPFD is the child's fd number of the QMP listening socket.
	QMPFD int
	// TapFD is the child's fd number of the NIC's tap queue; 0 leaves the
	// NIC without a backend.
	TapFD int
	// Disk is the read-only image backing the rootfs slot; "" leaves the
	// slot empty (emptyDisk).
	Disk      string
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
		"-accel", l.Accel,
		"-cpu", l.CPU,
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
	a = append(a, l.nicArgs()...)
	a = append(a, l.rootfsArgs()...)
	a = append(a, diskSlotArgs(s.DiskSlots)...)
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

// nicArgs is the NIC, with its tap backend when there is one. QEMU learns
// from the tap (TUNGETIFF) that it has no vnet header; it refuses
// vnet_hdr= next to fd=.
func (l launch) nicArgs() []string {
	dev := "virtio-net-device,id=" + nicID + ",mac=" + snapshotMAC
	if l.TapFD == 0 {
		return []string{"-device", dev}
	}
	return []string{
		"-netdev", "tap,id=" + nicID + ",fd=" + strconv.Itoa(l.TapFD),
		"-device", dev + ",netdev=" + nicID,
	}
}

// rootfsArgs is the rootfs slot and its read-only backend: a raw node
// over the image, or over an empty child that AttachRootfs can swap as
// AttachDisk swaps a spare slot's. The node is given as JSON, so no path
// needs QEMU's comma escaping.
func (l launch) rootfsArgs() []string {
	file := emptyDisk(childNode(rootfsID, 0))
	if l.Disk != "" {
		file = map[string]any{"driver": "file", "filename": l.Disk}
	}
	b, _ := json.Marshal(map[string]any{"node-name": rootfsID, "read-only": true, "driver": "raw", "file": file})
	return []string{
		"-blockdev", string(b),
		"-device", "virtio-blk-device,id=" + rootfsID + ",drive=" + rootfsID + ",serial=" + rootfsSerial,
	}
}

// diskSlotArgs are the spare disk slots, each empty: a read-only raw node
// over an empty null-co child (emptyDisk), so that AttachDisk can swap the child for
// an image while the VM runs (a raw node's file child is reopenable; the
// device's own node is not replaceable). The child is inline, so QEMU
// frees it once a swap drops it.
func diskSlotArgs(slots int) []string {
	var a []string
	for i := range slots {
		node := map[string]any{
			"driver": "raw", "node-name": diskID(i), "read-only": true,
			"file": emptyDisk(childNode(diskID(i), 0)),
		}
		b, _ := json.Marshal(node)
		a = append(a, "-blockdev", string(b),
			"-device", "virtio-blk-device,id="+diskID(i)+",drive="+diskID(i)+",serial="+diskSerial(i))
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
