package cloudhypervisor

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// hostBackends are the host ends a restore gives the snapshot's network
// device and rootfs slot; the ones the image names are never used.
type hostBackends struct {
	// Tap is the tap behind the network device, in the VMM's network
	// namespace; "" when the restore gives none.
	Tap string
	// NetNS says the restore names the network namespace the VMM runs in.
	NetNS bool
	// Disk is the filesystem image behind the rootfs slot, an absolute
	// path; "" when the restore gives none.
	Disk string
}

// tapQueues is the num_queues a restore's tap serves: it has one queue,
// one rx/tx pair, Cloud Hypervisor's default. More would make Cloud
// Hypervisor ask for a multi-queue tap, which TUNSETIFF refuses.
const tapQueues = 2

// backDevices puts host's backends behind the snapshot's network device
// (NetConfig: tap) and rootfs slot (DiskConfig: path, readonly,
// image_type) in cfg, and refuses every other disk and a second network
// device: their host ends would be the image's.
func backDevices(cfg map[string]json.RawMessage, runDir string, host hostBackends) (patched, error) {
	var p patched
	var err error
	if p.ownNetNS, err = backNet(cfg, host); err != nil {
		return patched{}, err
	}
	if p.rootfs, err = backRootfs(cfg, runDir, host.Disk); err != nil {
		return patched{}, err
	}
	return p, nil
}

// backNet sets the tap of the snapshot's network device. Without one from
// the restore, Cloud Hypervisor has no device that goes nowhere (NetConfig
// always has a host end: a tap, its fds, or vhost-user), so the tap is
// left to it (tap null: it creates one) and it must run in a network
// namespace of its own, which takes that tap away with it; ownNetNS says so.
func backNet(cfg map[string]json.RawMessage, host hostBackends) (ownNetNS bool, err error) {
	nets, err := deviceList(cfg, "net")
	if err != nil {
		return false, err
	}
	switch {
	case len(nets) > 1:
		return false, fmt.Errorf("net: the snapshot has %d network devices: a restore backs one, with the task's tap", len(nets))
	case len(nets) == 0 && host.Tap != "":
		return false, fmt.Errorf("net: the snapshot has no network device to put tap %q behind", host.Tap)
	case len(nets) == 0:
		return false, nil
	}
	n, err := intField(nets[0], "num_queues")
	if err != nil {
		return false, fmt.Errorf("net[0].num_queues: %w", err)
	}
	if n > tapQueues {
		return false, fmt.Errorf("net[0].num_queues = %d: the tap a restore gives has one queue, for num_queues %d", n, tapQueues)
	}
	switch {
	case host.Tap != "":
		nets[0]["tap"], _ = json.Marshal(host.Tap)
	case host.NetNS:
		return false, errors.New("net[0]: the restore gives a network namespace but no tap for the snapshot's network device")
	default:
		nets[0]["tap"] = json.RawMessage("null")
		ownNetNS = true
	}
	cfg["net"], err = json.Marshal(nets)
	return ownNetNS, err
}

// rootfsSlot is the snapshot's rootfs slot and the image behind it.
type rootfsSlot struct {
	// id is the disk's device id, which keys its state in state.json.
	id string
	// path is the image: the restore's disk, or emptyRootfs in the run
	// directory when it gives none.
	path  string
	empty bool
	// size of the image in bytes, known once prepared.
	size int64
}

// backRootfs backs the snapshot's rootfs slot (see rootfsIndex) with disk,
// or with an empty image when disk is "", read-only and raw whatever the
// snapshot said: the image is shared by every VM of one layer chain, and
// its bytes come from a container image, so Cloud Hypervisor must neither
// write it nor read it as qcow2 or vhdx. Any other disk is refused.
func backRootfs(cfg map[string]json.RawMessage, runDir, disk string) (*rootfsSlot, error) {
	disks, err := deviceList(cfg, "disks")
	if err != nil {
		return nil, err
	}
	i, err := rootfsIndex(disks)
	if err != nil {
		return nil, err
	}
	if i < 0 {
		if disk != "" {
			return nil, fmt.Errorf("disks: the snapshot has no rootfs slot (a disk with serial %q) to put %s behind", hypervisor.RootfsSerial, disk)
		}
		return nil, nil
	}
	for j := range disks {
		if j != i {
			return nil, fmt.Errorf("disks[%d]: the snapshot has a device this restore gives no host path for (only its rootfs slot, disks[%d], gets one)", j, i)
		}
	}
	var id string
	if err := json.Unmarshal(disks[i]["id"], &id); err != nil || id == "" {
		return nil, fmt.Errorf("disks[%d] (the rootfs slot) has no id %s: its state cannot be found", i, disks[i]["id"])
	}
	slot := &rootfsSlot{id: id, path: disk}
	if disk == "" {
		slot.path, slot.empty = filepath.Join(runDir, emptyRootfs), true
	}
	disks[i]["path"], _ = json.Marshal(slot.path)
	disks[i]["readonly"] = json.RawMessage("true")
	disks[i]["image_type"] = json.RawMessage(`"Raw"`)
	if cfg["disks"], err = json.Marshal(disks); err != nil {
		return nil, err
	}
	return slot, nil
}

// rootfsIndex finds the rootfs slot among disks: the one whose serial is
// hypervisor.RootfsSerial, else the only disk; -1 when there is none.
func rootfsIndex(disks []map[string]json.RawMessage) (int, error) {
	found := -1
	for i, d := range disks {
		var serial string
		if json.Unmarshal(d["serial"], &serial) != nil || serial != hypervisor.RootfsSerial {
			continue
		}
		if found >= 0 {
			return 0, fmt.Errorf("disks[%d] and disks[%d] both have serial %q: the snapshot has one rootfs slot", found, i, hypervisor.RootfsSerial)
		}
		found = i
	}
	switch {
	case found >= 0:
		return found, nil
	case len(disks) == 1:
		return 0, nil
	case len(disks) > 1:
		return 0, fmt.Errorf("disks: %d disks, none with serial %q: the rootfs slot is not known", len(disks), hypervisor.RootfsSerial)
	}
	return -1, nil
}

// deviceList decodes cfg[device], an array of device objects or empty.
func deviceList(cfg map[string]json.RawMessage, device string) ([]map[string]json.RawMessage, error) {
	var devs []map[string]json.RawMessage
	if isEmpty(cfg[device]) {
		return nil, nil
	}
	if err := json.Unmarshal(cfg[device], &devs); err != nil {
		return nil, fmt.Errorf("%s: want an array of objects: %w", device, err)
	}
	return devs, nil
}

// intField decodes dev[field], an integer or absent (0).
func intField(dev map[string]json.RawMessage, field string) (int64, error) {
	if isNull(dev[field]) {
		return 0, nil
	}
	var n int64
	if err := json.Unmarshal(dev[field], &n); err != nil {
		return 0, fmt.Errorf("want an integer: %w", err)
	}
	return n, nil
}
