package qemu

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// memfdChildPath is how QEMU opens the memfd we pass as its fd 4.
const memfdChildPath = "/proc/self/fd/4"

// Restore starts QEMU on the chain staged in req.StagedDir and loads it,
// leaving the VM paused. The command line comes from the top link's
// qemu.json, with the host's accelerator and CPU model; the device state is
// loaded with migrate-incoming while guest RAM comes from the staged
// memory file:
//   - mmap: mapped private (share=off) over the staged hard link, so
//     clones share its page cache and guest writes never reach the file;
//   - copy: the file's data extents copied into a memfd QEMU maps shared,
//     so nothing reads the staged file after the copy.
//
// QEMU starts in req.NetNS when set, with req.NIC's tap behind the
// snapshot's NIC and req.Disk behind its rootfs slot.
func (d *Driver) Restore(ctx context.Context, req hypervisor.RestoreRequest) (hypervisor.VM, error) {
	v, err := d.restore(ctx, req)
	if err != nil {
		return nil, err
	}
	return v, nil
}

func (d *Driver) restore(ctx context.Context, req hypervisor.RestoreRequest) (*VM, error) {
	staged, shape, err := openStaged(req)
	if err != nil {
		return nil, err
	}
	l, a, err := d.restoreLaunch(shape, req)
	if err != nil {
		return nil, err
	}
	if err := checkState(staged.StatePath(StateFile), staged.Top()); err != nil {
		return nil, err
	}
	written := newPageHashes(staged.Top().PageSize)
	// src is a copy restore's staged memory, hashed for a later diff once
	// the VM is loaded; the open file keeps the data even if the staged link
	// is dropped before the hashing ends.
	src, err := guestMemory(ctx, req, staged, shape.MemoryBytes, written, &l, &a)
	if err != nil {
		return nil, err
	}
	defer func() {
		if src != nil {
			src.Close()
		}
	}()
	t := time.Now()
	v, err := d.spawnVM(ctx, req.RunDir, l, a, !req.Attached)
	if err != nil {
		return nil, err
	}
	v.staged, v.written = staged, written
	req.Phase("spawn", time.Since(t))
	// Before the load: loading virtio devices reads their rings in guest
	// memory, which must be the chain's by then.
	if req.Mode == hypervisor.ModeMmap && len(staged.Pending()) > 0 {
		t = time.Now()
		if err := v.writeDeltas(ctx); err != nil {
			v.Close()
			return nil, err
		}
		req.Phase("delta", time.Since(t))
	}
	t = time.Now()
	if err := v.load(ctx, staged.StatePath(StateFile)); err != nil {
		v.Close()
		return nil, err
	}
	req.Phase("load", time.Since(t))
	if src != nil {
		// Only a diff snapshot waits for the hashes: making them while
		// QEMU starts and loads would slow the restore down on a busy host.
		v.hashes, src = hashLater(src, shape.MemoryBytes, written), nil
	}
	return v, nil
}

// guestMemory sets l's guest RAM for req's mode: the staged file mapped
// privately (mmap), or a memfd filled from it (copy), whose open source it
// returns.
func guestMemory(ctx context.Context, req hypervisor.RestoreRequest, staged *chain.Staged, size int64, written *pageHashes, l *launch, a *attach) (*os.File, error) {
	switch req.Mode {
	case hypervisor.ModeMmap:
		l.Memory = memory{Path: staged.MemoryPath(), Share: false}
		return nil, nil
	case hypervisor.ModeCopy:
		memfd, src, err := fillCopy(ctx, req, staged, size, written)
		if err != nil {
			return nil, err
		}
		a.memfd, l.Memory = memfd, memory{Path: memfdChildPath, Share: true}
		return src, nil
	}
	return nil, fmt.Errorf("qemu restore mode %q: want %s or %s (QEMU cannot restore lazily from a file)", req.Mode, hypervisor.ModeMmap, hypervisor.ModeCopy)
}

// restoreLaunch is the command line and files of a restore of shape, but
// for the guest RAM: the host's accelerator and CPU model (a snapshot baked
// with others is refused), and the request's network namespace, NIC and
// disk, each checked before anything starts.
func (d *Driver) restoreLaunch(shape Shape, req hypervisor.RestoreRequest) (launch, attach, error) {
	accel, cpu, reason, err := d.hostMachine()
	if err != nil {
		return launch{}, attach{}, err
	}
	if err := checkBakedOn(shape, accel, cpu, reason); err != nil {
		return launch{}, attach{}, err
	}
	a, disk, err := attachFor(req)
	if err != nil {
		return launch{}, attach{}, err
	}
	return launch{Shape: shape, Accel: accel, CPU: cpu, Disk: disk, Incoming: true}, a, nil
}

// openStaged takes the staged chain and reads the top link's machine
// shape, and checks they describe the same QEMU guest.
func openStaged(req hypervisor.RestoreRequest) (*chain.Staged, Shape, error) {
	staged, err := req.OpenStaged(Name)
	if err != nil {
		return nil, Shape{}, err
	}
	top := staged.Top()
	shape, err := ReadShape(staged.StatePath(ShapeFile))
	if err != nil {
		return nil, Shape{}, err
	}
	if shape.MemoryBytes != top.MemoryBytes || shape.VCPUs != top.VCPUs {
		return nil, Shape{}, fmt.Errorf("qemu.json (%d bytes, %d vcpus) does not match link.json (%d bytes, %d vcpus)",
			shape.MemoryBytes, shape.VCPUs, top.MemoryBytes, top.VCPUs)
	}
	return staged, shape, nil
}

// load streams the device state in and waits until QEMU has it; the VM
// stays paused (-S). A QEMU that dies while loading is reported with its
// exit status and log.
func (v *VM) load(ctx context.Context, statePath string) error {
	f, err := os.Open(statePath)
	if err != nil {
		return fmt.Errorf("open device state: %w", err)
	}
	defer f.Close()
	if err := v.noAnnounce(ctx); err != nil {
		return fmt.Errorf("load device state: %w", err)
	}
	err = v.migrate(ctx, "migrate-incoming", f)
	if err != nil && v.proc.ExitedWithin(exitGrace) {
		return fmt.Errorf("load device state: %w", v.proc.ExitError())
	}
	if err != nil {
		return fmt.Errorf("load device state: %w", err)
	}
	return nil
}

// noAnnounce stops QEMU announcing the NIC once the load completes: it
// would send RARP frames from the snapshot's MAC, which every clone of the
// snapshot shares, out of the task's tap. The guest announces itself once
// it has its own MAC and address.
func (v *VM) noAnnounce(ctx context.Context) error {
	return v.command(ctx, "migrate-set-parameters", map[string]any{"announce-rounds": 0})
}
