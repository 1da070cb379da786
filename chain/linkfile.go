package chain

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/fsmode"
)

// Size bounds of the files of a link, so that a hostile layer cannot make a
// reader allocate or copy without limit. The memory files are bounded by
// the memory size link.json records.
const (
	// MaxStateFile bounds one hypervisor state file (QEMU's device state
	// is ~60 KB, Cloud Hypervisor's and Firecracker's are of that order).
	MaxStateFile = 64 << 20
	// maxLinkJSON bounds link.json.
	maxLinkJSON = 1 << 20
	// maxStagedChain bounds chain.json, one small entry per link.
	maxStagedChain = 16 << 20
)

// OpenLinkFile opens a file of a link (or of a staged chain) for reading:
// it must be a regular file of at most maxSize bytes. Links come from
// images, so the last path element is not followed if it is a symlink
// (which could name any host file), and the open does not block (a FIFO
// would block it forever); the type and size are checked on the open file,
// so nothing can swap the file between the check and the read.
func OpenLinkFile(path string, maxSize int64) (*os.File, error) {
	return openRegular(path, unix.O_NOFOLLOW, maxSize)
}

// ReadLinkFile reads a whole file of a link, opened as OpenLinkFile does.
func ReadLinkFile(path string, maxSize int64) ([]byte, error) {
	f, err := OpenLinkFile(path, maxSize)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readAllSized(f, maxSize)
}

// CopyStateFile copies the state file src of a link to dst, a new private
// file (mode 0644) the caller may patch. src is opened as OpenLinkFile does
// with the MaxStateFile bound; dst must not be a symlink.
func CopyStateFile(src, dst string) error {
	in, err := OpenLinkFile(src, MaxStateFile)
	if err != nil {
		return fmt.Errorf("copy state file: %w", err)
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return fmt.Errorf("copy state file: %w", err)
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return fmt.Errorf("copy state file: %w", err)
	}
	_, err = io.CopyN(out, in, fi.Size())
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(dst)
		return fmt.Errorf("copy state file %s: %w", src, err)
	}
	return nil
}

// openRegular opens path read-only and non-blocking with extra flags and
// checks, on the open file, that it is regular and at most maxSize bytes.
func openRegular(path string, flags int, maxSize int64) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK|flags, 0)
	if errors.Is(err, unix.ELOOP) {
		return nil, fmt.Errorf("%s: a symbolic link, want a regular file", path)
	}
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	switch {
	case !fi.Mode().IsRegular():
		f.Close()
		return nil, fmt.Errorf("%s: a %s, want a regular file", path, fsmode.TypeName(fi.Mode()))
	case fi.Size() > maxSize:
		f.Close()
		return nil, fmt.Errorf("%s: %d bytes, larger than the %d allowed", path, fi.Size(), maxSize)
	}
	return f, nil
}

// readAllSized reads f to its end, failing if it grew past maxSize since
// it was opened.
func readAllSized(f *os.File, maxSize int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(f, maxSize+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", f.Name(), err)
	}
	if int64(len(b)) > maxSize {
		return nil, fmt.Errorf("%s: larger than the %d bytes allowed", f.Name(), maxSize)
	}
	return b, nil
}
