package qemu

import (
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// fillMemfd returns a memfd of size bytes holding the file at path, and
// that file, open, for the caller to read again without a second open and
// check. Only the file's data extents are copied (SEEK_DATA/SEEK_HOLE):
// holes are zero pages the memfd already reads as zero, and never allocates.
func fillMemfd(path string, size int64) (memfd, src *os.File, err error) {
	src, err = os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("open staged memory: %w", err)
	}
	defer func() {
		if err != nil {
			src.Close()
		}
	}()
	st, err := src.Stat()
	if err != nil {
		return nil, nil, fmt.Errorf("stat staged memory: %w", err)
	}
	if st.Size() != size {
		return nil, nil, fmt.Errorf("staged memory %s is %d bytes, the snapshot's guest has %d", path, st.Size(), size)
	}
	fd, err := unix.MemfdCreate("cocoon-guest-ram", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, nil, fmt.Errorf("create memfd: %w", err)
	}
	memfd = os.NewFile(uintptr(fd), "cocoon-guest-ram")
	if err = copyExtents(memfd, src, size); err != nil {
		memfd.Close()
		return nil, nil, err
	}
	return memfd, src, nil
}

// copyExtents sendfiles src's data extents into dst: the kernel copies
// from src's page cache into the memfd's pages, with no user-space buffer
// and no page faults (BenchmarkFillMemfd: ~2 GB/s against ~1 GB/s for
// reading into a mapping of the memfd).
func copyExtents(dst, src *os.File, size int64) error {
	if err := dst.Truncate(size); err != nil {
		return fmt.Errorf("size memfd: %w", err)
	}
	for e, err := range chain.DataRegions(src) {
		if err != nil {
			return fmt.Errorf("find data in staged memory: %w", err)
		}
		if err := sendRange(dst, src, e.Offset, e.End()); err != nil {
			return err
		}
	}
	return nil
}

// sendRange copies [start, end) of src to the same offsets in dst.
func sendRange(dst, src *os.File, start, end int64) error {
	if _, err := dst.Seek(start, io.SeekStart); err != nil {
		return fmt.Errorf("seek memfd: %w", err)
	}
	for off := start; off < end; {
		n, err := unix.Sendfile(int(dst.Fd()), int(src.Fd()), &off, int(min(end-off, 1<<30)))
		if err != nil {
			return fmt.Errorf("copy staged memory at %d: %w", off, err)
		}
		if n == 0 {
			return fmt.Errorf("copy staged memory at %d: unexpected end of file", off)
		}
	}
	return nil
}
