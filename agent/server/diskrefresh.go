package server

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// BlockDisk is a block device node, open.
type BlockDisk interface {
	// Capacity is the disk's size in bytes, as its driver last read it.
	Capacity() (uint64, error)
	// Flush drops the blocks the guest cached of the disk.
	Flush() error
	Close() error
}

// refresh has the guest see what backs block device name (virtio device
// dev) now, an image of size bytes, unless something holds its node: a
// mounted disk is never pulled from under its users. When the disk's
// capacity holds size it only drops the blocks the guest cached of it (the
// kernel drops them at a disk's last close, but a process may keep it
// open), else it unbinds dev from virtio_blk and binds it again; it
// reports whether it probed.
func (l LinuxMounts) refresh(dev, name string, size uint64) (bool, error) {
	binding.Lock()
	defer binding.Unlock()
	open := l.OpenDisk
	if open == nil {
		open = openDisk
	}
	d, held, err := open(filepath.Join(l.dev(), name))
	if err != nil || held {
		return false, err
	}
	if size > 0 {
		if capacity, err := d.Capacity(); err == nil && capacity >= size {
			return false, errors.Join(d.Flush(), d.Close())
		}
	}
	if err := d.Close(); err != nil {
		return false, err
	}
	driver := filepath.Join(l.sys(), "bus/virtio/drivers/virtio_blk")
	for _, op := range []string{"unbind", "bind"} {
		if err := os.WriteFile(filepath.Join(driver, op), []byte(dev), 0); err != nil {
			return false, fmt.Errorf("probe %s again: %s: %w", dev, op, err)
		}
	}
	return true, nil
}

// openDisk opens block device node exclusively: that fails with EBUSY
// while something mounts or claims it.
func openDisk(node string) (BlockDisk, bool, error) {
	f, err := os.OpenFile(node, os.O_RDONLY|unix.O_EXCL|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.EBUSY) {
		return nil, true, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("open %s: %w", node, err)
	}
	return blockFile{f}, false, nil
}

// blockFile is a block device node's open file.
type blockFile struct{ *os.File }

func (b blockFile) Capacity() (uint64, error) {
	size, err := unix.IoctlGetUint64(int(b.Fd()), unix.BLKGETSIZE64)
	if err != nil {
		return 0, fmt.Errorf("size of %s: %w", b.Name(), err)
	}
	return size, nil
}

func (b blockFile) Flush() error {
	if err := unix.IoctlSetInt(int(b.Fd()), unix.BLKFLSBUF, 0); err != nil {
		return fmt.Errorf("drop the cached blocks of %s: %w", b.Name(), err)
	}
	return nil
}
