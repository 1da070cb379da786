package firecracker

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// A snapshot's vmstate comes from its image and names the host ends of
// the guest's devices, which Firecracker (v1.16.1, src/vmm/src/persist.rs
// and device_manager/persist.rs) opens while it loads the snapshot:
//
//   - each block device's disk_path (or vhost-user socket_path),
//   - each pmem device's path_on_host,
//   - each network device's tap_if_name,
//   - the vsock device's uds_path.
//
// snapshot/load can override only the last two (network_overrides,
// vsock_override), and vmstate is Firecracker's own versioned binary
// format, so the driver cannot read or patch it before the load. It
// overrides what it can, puts the rootfs slot's image where the snapshot
// names it (placeRootfs), and, once the VM is loaded but before it has
// run, asks GET /vm/config for the devices restored and refuses any host
// end this restore did not give: the guest never runs with a host file,
// tap or socket the image chose. Firecracker has still opened those paths
// during the load; only a jail (Firecracker's jailer: chroot, mount
// namespace, unprivileged user) keeps the opening itself from the host.
// Taps are kept from the host's network namespace: a restore without a
// NIC runs Firecracker in a network namespace of its own.

// nicIfaceID is the iface_id of the network interface a cocoon Firecracker
// snapshot has: the tap a restore gives goes behind it. vmstate cannot be
// read before the load, so the interface is known by this name; a
// snapshot without it fails the load (an override of an unknown
// interface).
const nicIfaceID = "eth0"

// hostBackends are the host ends a restore gives the snapshot's devices.
type hostBackends struct {
	// Vsock is the vsock device's unix socket (always overridden).
	Vsock string
	// Taps maps a network interface's iface_id to its tap interface.
	Taps map[string]string
	// Disk is the image placed for the rootfs slot; "" when the restore
	// gives none.
	Disk string
	// OwnNetNS: the restore gives neither a network namespace nor a NIC,
	// so Firecracker runs in a network namespace of its own, where the
	// taps the snapshot's interfaces name are created, used by nothing
	// else and gone with it: they are not the host's, and are accepted.
	OwnNetNS bool
}

// newHostBackends are the backends req gives, disk its checked Disk.
func newHostBackends(req hypervisor.RestoreRequest, disk string) hostBackends {
	h := hostBackends{Vsock: filepath.Join(req.RunDir, vsockSock), Disk: disk}
	switch {
	case req.NIC != nil:
		h.Taps = map[string]string{nicIfaceID: req.NIC.TapName}
	case req.NetNS == nil:
		h.OwnNetNS = true
	}
	return h
}

// describe names the tap a load puts behind which interface, for errors.
func (h hostBackends) describe() string {
	var s []string
	for _, o := range h.overrides() {
		s = append(s, fmt.Sprintf("tap %q behind network interface %q", o.HostDevName, o.IfaceID))
	}
	if len(s) == 0 {
		return ""
	}
	return " with " + strings.Join(s, ", ")
}

// networkOverride is NetworkOverride in the spec.
type networkOverride struct {
	IfaceID     string `json:"iface_id"`
	HostDevName string `json:"host_dev_name"`
}

// overrides are the snapshot/load overrides for host, in iface_id order.
func (h hostBackends) overrides() []networkOverride {
	var out []networkOverride
	for _, id := range slices.Sorted(maps.Keys(h.Taps)) {
		out = append(out, networkOverride{IfaceID: id, HostDevName: h.Taps[id]})
	}
	return out
}

// restoredConfig is the part of FullVmConfiguration (GET /vm/config) that
// names the host ends of devices.
type restoredConfig struct {
	Drives []restoredDrive `json:"drives"`
	Net    []restoredNet   `json:"network-interfaces"`
	Pmem   []restoredPmem  `json:"pmem"`
	Vsock  *restoredVsock  `json:"vsock"`
}

// restoredDrive is a Drive: a host file, or a vhost-user socket.
type restoredDrive struct {
	DriveID    string `json:"drive_id"`
	PathOnHost string `json:"path_on_host"`
	Socket     string `json:"socket"`
	IsReadOnly bool   `json:"is_read_only"`
}

// restoredNet is a NetworkInterface.
type restoredNet struct {
	IfaceID     string `json:"iface_id"`
	HostDevName string `json:"host_dev_name"`
}

// restoredPmem is a Pmem device.
type restoredPmem struct {
	ID         string `json:"id"`
	PathOnHost string `json:"path_on_host"`
}

// restoredVsock is a Vsock device.
type restoredVsock struct {
	UDSPath string `json:"uds_path"`
}

// checkRestored fails unless the loaded VM's devices use only host's
// backends, naming the first one that does not.
func (v *vm) checkRestored(ctx context.Context, host hostBackends) error {
	var cfg restoredConfig
	if err := v.api.get(ctx, "vm/config", &cfg); err != nil {
		return fmt.Errorf("check restored devices: %w", err)
	}
	return cfg.check(host)
}

func (c restoredConfig) check(host hostBackends) error {
	slot, err := rootfsDrive(c.Drives)
	if err != nil {
		return err
	}
	if slot < 0 && host.Disk != "" {
		return fmt.Errorf("the snapshot has no rootfs slot (a drive recorded as %q) to put %s behind", rootfsPath, host.Disk)
	}
	if len(c.Pmem) > 0 {
		p := c.Pmem[0]
		return fmt.Errorf("pmem[0] (id %q) is backed by host file %q, as the image chose: "+
			"Firecracker cannot override a pmem device's host file on load, so snapshots with pmem are refused", p.ID, p.PathOnHost)
	}
	for i, n := range c.Net {
		if tap, ok := host.Taps[n.IfaceID]; !host.OwnNetNS && (!ok || tap != n.HostDevName) {
			return fmt.Errorf("network-interfaces[%d] (iface_id %q) is backed by tap %q, as the image chose: this restore gives it no tap", i, n.IfaceID, n.HostDevName)
		}
	}
	if c.Vsock != nil && c.Vsock.UDSPath != host.Vsock {
		return fmt.Errorf("vsock is backed by socket %q, not this VM's %q", c.Vsock.UDSPath, host.Vsock)
	}
	return nil
}

// rootfsDrive finds the rootfs slot among drives (-1: none), the one drive
// accepted: backed by rootfsPath, read-only. Firecracker cannot override a
// drive's host end on load, so any other drive is backed by a file the
// image chose.
func rootfsDrive(drives []restoredDrive) (int, error) {
	slot := -1
	for i, d := range drives {
		if d.PathOnHost != rootfsPath || d.Socket != "" {
			return -1, fmt.Errorf("drives[%d] (drive_id %q) is backed by host file %q (socket %q), as the image chose: "+
				"Firecracker cannot override a drive's host end on load, so only the rootfs slot, recorded as %q, is accepted", i, d.DriveID, d.PathOnHost, d.Socket, rootfsPath)
		}
		if slot >= 0 {
			return -1, fmt.Errorf("drives[%d] and drives[%d] are both the rootfs slot %q", slot, i, rootfsPath)
		}
		if !d.IsReadOnly {
			return -1, fmt.Errorf("drives[%d] (drive_id %q), the rootfs slot, is writable: its image is shared, the snapshot must have it read-only", i, d.DriveID)
		}
		slot = i
	}
	return slot, nil
}
