package uffd

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// memFile is the snapshot's guest memory file, mapped read-only and private:
// UFFDIO_COPY reads pages straight from the page cache through the mapping,
// which every clone restored from the same hard-linked inode shares.
type memFile struct {
	data []byte
	// present holds the file offsets that have data; pages wholly outside it
	// are holes and get the shared zero page instead of a copy.
	present rangeSet
}

// openMemFile maps path and records where its data (as opposed to holes) is.
func openMemFile(path string) (*memFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open memory file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat memory file: %w", err)
	}
	if st.Size() == 0 {
		return nil, fmt.Errorf("memory file %s is empty", path)
	}
	m := &memFile{}
	if err := m.scanData(f); err != nil {
		return nil, fmt.Errorf("scan memory file %s: %w", path, err)
	}
	m.data, err = unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("mmap memory file %s: %w", path, err)
	}
	return m, nil
}

// scanData records the file's data extents. A filesystem without hole
// support reports the whole file as data, which is still correct.
func (m *memFile) scanData(f *os.File) error {
	for e, err := range chain.DataRegions(f) {
		if err != nil {
			return err
		}
		m.present.add(uint64(e.Offset), uint64(e.End()))
	}
	return nil
}

func (m *memFile) size() uint64 { return uint64(len(m.data)) }

// isHole reports whether [off, off+n) holds no data.
func (m *memFile) isHole(off, n uint64) bool { return !m.present.intersects(off, off+n) }

// addr is the address of the file's byte at off in the mapping.
func (m *memFile) addr(off uint64) uint64 {
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(m.data)))) + off
}

func (m *memFile) close() error {
	if err := unix.Munmap(m.data); err != nil {
		return fmt.Errorf("unmap memory file: %w", err)
	}
	return nil
}
