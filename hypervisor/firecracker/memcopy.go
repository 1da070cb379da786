package firecracker

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// copyMemory makes the VM's private copy of the staged memory. Only the
// file's data is copied (SEEK_DATA/SEEK_HOLE, copy_file_range): guest
// memory is mostly zero pages, and the holes stay holes.
func copyMemory(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("open staged memory: %w", err)
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return fmt.Errorf("stat staged memory: %w", err)
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create private memory copy: %w", err)
	}
	err = out.Truncate(st.Size())
	if err == nil {
		err = copyData(in, out)
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("copy staged memory: %w", err)
	}
	return nil
}

// copyData copies each data range of in to the same offset of out.
func copyData(in, out *os.File) error {
	for e, err := range chain.DataRegions(in) {
		if err != nil {
			return err
		}
		if err := copyRange(in, out, e.Offset, e.Length); err != nil {
			return err
		}
	}
	return nil
}

// copyRange copies [off, off+n) in the kernel, or through user space where
// the kernel cannot copy between the two filesystems.
func copyRange(in, out *os.File, off, n int64) error {
	for n > 0 {
		roff, woff := off, off
		c, err := unix.CopyFileRange(int(in.Fd()), &roff, int(out.Fd()), &woff, int(min(n, 1<<30)), 0)
		if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
			_, err = io.Copy(io.NewOffsetWriter(out, off), io.NewSectionReader(in, off, n))
			return err
		}
		if err != nil {
			return fmt.Errorf("copy_file_range at %#x: %w", off, err)
		}
		if c == 0 {
			return fmt.Errorf("copy_file_range at %#x: source ended early", off)
		}
		off += int64(c)
		n -= int64(c)
	}
	return nil
}
