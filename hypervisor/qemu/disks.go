package qemu

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	hostattach "github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/attach"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/vmmproc"
)

// MaxDiskSlots bounds a snapshot's spare disk slots: microvm has 24
// virtio-mmio transports (with its second IOAPIC, on by default) and every
// VM's own devices take 3; the rest is left for devices to come.
const MaxDiskSlots = 16

var (
	_ hypervisor.DiskAttacher   = (*VM)(nil)
	_ hypervisor.RootfsAttacher = (*VM)(nil)
)

// diskID is the node name and device id of spare slot i.
func diskID(slot int) string { return "disk" + strconv.Itoa(slot) }

// diskSerial is the serial by which the guest finds spare slot i.
func diskSerial(slot int) string { return "cocoon-disk-" + strconv.Itoa(slot) }

// emptyCapacity is the size of an empty slot. The guest reads a disk's
// capacity when it probes it, at boot, and a snapshot keeps it: an image
// up to this size put behind a slot after a restore needs no probe (see
// the agent's LinuxMounts.Disk).
const emptyCapacity = 1 << 40

// emptyDisk is a slot's backend node with nothing in it: emptyCapacity of
// zeroes (the boot's partition scan of it must find nothing).
func emptyDisk(node string) map[string]any {
	return map[string]any{"driver": "null-co", "node-name": node, "read-only": true, "size": emptyCapacity, "read-zeroes": true}
}

// imageDisk is a slot's backend node over the image at path.
func imageDisk(node, path string) map[string]any {
	return map[string]any{"driver": "file", "node-name": node, "filename": path, "read-only": true}
}

// childNode names the gen'th backend node of the raw node slot; the
// command line's is gen 0.
func childNode(slot string, gen int) string { return slot + "." + strconv.Itoa(gen) }

// diskSlots is what backs each swappable slot (the spare slots and the
// rootfs slot) now, by the slot's raw node. A slot missing from cur still
// has the command line's backend, which its raw node owns (QEMU frees it
// once a swap drops it); any other was added over QMP and must be deleted
// once replaced, or QEMU keeps its file open.
type diskSlots struct {
	mu  sync.Mutex
	cur map[string]string
	// gen numbers added nodes: a name is never used twice, so a node a
	// failed cleanup left behind never blocks the next attach.
	gen int
}

// DiskSlots is how many spare disk slots the VM's snapshot has.
func (v *VM) DiskSlots() int { return v.shape.DiskSlots }

// AttachDisk backs spare slot with the read-only filesystem image at path,
// in place of what backed it, paused or running. The guest must probe the
// device again to see the image (see hypervisor.DiskAttacher).
func (v *VM) AttachDisk(ctx context.Context, slot int, path string) (string, error) {
	if err := v.checkSlot(slot); err != nil {
		return "", err
	}
	abs, err := hostattach.CheckDisk(path)
	if err != nil {
		return "", err
	}
	if err := v.swapDisk(ctx, diskID(slot), func(node string) map[string]any { return imageDisk(node, abs) }); err != nil {
		return "", fmt.Errorf("attach %s to disk slot %d: %w", abs, slot, err)
	}
	return diskSerial(slot), nil
}

// AttachRootfs backs the rootfs slot, which the VM was restored with
// empty, with the read-only filesystem image at path.
func (v *VM) AttachRootfs(ctx context.Context, path string) error {
	abs, err := hostattach.CheckDisk(path)
	if err != nil {
		return err
	}
	if err := v.swapDisk(ctx, rootfsID, func(node string) map[string]any { return imageDisk(node, abs) }); err != nil {
		return fmt.Errorf("attach %s to the rootfs slot: %w", abs, err)
	}
	return nil
}

// DetachDisk leaves spare slot empty (emptyDisk); QEMU closes the image
// that backed it.
func (v *VM) DetachDisk(ctx context.Context, slot int) error {
	if err := v.checkSlot(slot); err != nil {
		return err
	}
	if err := v.swapDisk(ctx, diskID(slot), emptyDisk); err != nil {
		return fmt.Errorf("detach disk slot %d: %w", slot, err)
	}
	return nil
}

func (v *VM) checkSlot(slot int) error {
	if slot < 0 || slot >= v.shape.DiskSlots {
		return fmt.Errorf("disk slot %d: the snapshot has %d spare disk slots (0 to %d): %w",
			slot, v.shape.DiskSlots, v.shape.DiskSlots-1, errdefs.ErrInvalidArgument)
	}
	return nil
}

// swapDisk backs the slot whose raw node is slot with the node newNode
// makes: it is added, the raw node is reopened over it, and the node it
// replaces deleted. On error the slot keeps its backend.
func (v *VM) swapDisk(ctx context.Context, slot string, newNode func(name string) map[string]any) error {
	ctx, cancel := vmmproc.WithDefaultTimeout(ctx, commandTimeout)
	defer cancel()
	d := &v.disks
	d.mu.Lock()
	defer d.mu.Unlock()
	d.gen++
	name := childNode(slot, d.gen)
	if err := v.qmp.Execute(ctx, "blockdev-add", newNode(name), nil); err != nil {
		return err
	}
	reopen := map[string]any{"options": []map[string]any{{
		"driver": "raw", "node-name": slot, "read-only": true, "file": name,
	}}}
	if err := v.qmp.Execute(ctx, "blockdev-reopen", reopen, nil); err != nil {
		return errors.Join(err, v.deleteNode(ctx, name))
	}
	old := d.cur[slot]
	if d.cur == nil {
		d.cur = map[string]string{}
	}
	d.cur[slot] = name
	if old == "" {
		return nil
	}
	// The slot has its new backend whatever happens now: a node left
	// behind only keeps its file open until QEMU exits.
	if err := v.deleteNode(ctx, old); err != nil {
		log.G(ctx).WithError(err).WithField("slot", slot).Warn("replaced disk node not deleted: qemu keeps its file open")
	}
	return nil
}

// deleteNode deletes a node added over QMP, even once ctx has ended.
func (v *VM) deleteNode(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commandTimeout)
	defer cancel()
	return v.qmp.Execute(ctx, "blockdev-del", map[string]string{"node-name": name}, nil)
}
