package cloudhypervisor

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// The rootfs slot's image when a restore gives none: zeros, one block
// long, because Cloud Hypervisor reads an image's first block to detect
// its format and fails on a shorter one. The guest leaves a slot without
// a disk unbound.
const (
	emptyRootfs     = "empty-rootfs.img"
	emptyRootfsSize = 4096
)

// sectorSize is virtio-blk's sector: capacities count them.
const sectorSize = 512

// prepare makes the slot's empty image if it has one, and learns the
// image's size.
func (s *rootfsSlot) prepare() error {
	if s.empty {
		f, err := os.OpenFile(s.path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o444)
		if err != nil {
			return fmt.Errorf("create empty rootfs image: %w", err)
		}
		err = f.Truncate(emptyRootfsSize)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("create empty rootfs image: %w", err)
		}
	}
	st, err := os.Stat(s.path)
	if err != nil {
		return fmt.Errorf("rootfs image: %w", err)
	}
	s.size = st.Size()
	return nil
}

// setRootfsSize sets the capacity state.json records for the rootfs slot
// to the size of the image now behind it. Cloud Hypervisor restores a
// virtio-blk device's capacity from its state (BlockState: disk_nsectors
// and config.capacity), not from the image it opens, and cannot resize a
// read-only image after the restore (vm.resize-disk truncates the file),
// so without this the guest would see the size of whatever image backed
// the slot when the snapshot was taken. The device's state is the JSON
// string snapshots["device-manager"].snapshots[id].snapshot_data.state
// (vm-migration's Snapshot, v53.0). Everything else is kept as it was.
func setRootfsSize(raw []byte, slot *rootfsSlot) ([]byte, error) {
	sectors, _ := json.Marshal(slot.size / sectorSize)
	path := []string{"snapshots", "device-manager", "snapshots", slot.id, "snapshot_data", "state"}
	out, err := editAt(raw, path, func(v json.RawMessage) (json.RawMessage, error) {
		var state string
		if err := json.Unmarshal(v, &state); err != nil {
			return nil, fmt.Errorf("want the device state as a JSON string: %w", err)
		}
		set := func(json.RawMessage) (json.RawMessage, error) { return sectors, nil }
		b, err := editAt([]byte(state), []string{"disk_nsectors"}, set)
		if err == nil {
			b, err = editAt(b, []string{"config", "capacity"}, set)
		}
		if err != nil {
			return nil, fmt.Errorf("not a virtio-block state: %w", err)
		}
		return json.Marshal(string(b))
	})
	if err != nil {
		return nil, fmt.Errorf("rootfs slot %q: %w", slot.id, err)
	}
	return out, nil
}

// editAt replaces the value at path (object keys, each present) in the
// JSON document raw by what edit makes of it.
func editAt(raw []byte, path []string, edit func(json.RawMessage) (json.RawMessage, error)) ([]byte, error) {
	if len(path) == 0 {
		return edit(raw)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, fmt.Errorf("%s: want an object: %w", path[0], err)
	}
	v, ok := obj[path[0]]
	if !ok || isNull(v) {
		return nil, fmt.Errorf("no %s", strings.Join(path, "."))
	}
	v, err := editAt(v, path[1:], edit)
	if err != nil {
		return nil, err
	}
	obj[path[0]] = v
	return json.Marshal(obj)
}
