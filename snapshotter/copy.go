package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// linkOrCopy hard links src at dst. On EXDEV it falls back to a reflink
// (link(2) fails across mounts even of one filesystem, where FICLONE works),
// then to an exact sparse copy: the staged memory (or rootfs image) is still
// correct, but VMs no longer share its page cache. Never a symlink: the flat
// file may be evicted once nothing pins it.
func linkOrCopy(ctx context.Context, src, dst string) error {
	err := os.Link(src, dst)
	if err == nil || !errors.Is(err, unix.EXDEV) {
		if err != nil {
			return fmt.Errorf("stage %s: %w", filepath.Base(dst), err)
		}
		return nil
	}
	how, err := cloneFile(src, dst)
	if err != nil {
		return fmt.Errorf("stage %s across filesystems: %w", filepath.Base(dst), err)
	}
	log.G(ctx).WithFields(log.Fields{"src": src, "dst": dst, "method": how}).
		Warn("staging dir is on another filesystem than the flat cache: file copied, page-cache sharing between VMs is lost")
	return nil
}

// cloneFile makes dst a private read-only copy of src by reflink if the
// filesystem can, else by copying only src's data regions.
func cloneFile(src, dst string) (how string, err error) {
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return "", err
	}
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = cerr
		}
		if err != nil {
			os.Remove(dst)
		}
	}()
	// No fsync: like all of a staged dir, the copy is rebuilt after a
	// host crash (restageAfterReboot).
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		return "reflink", nil
	}
	if err := sparseCopy(out, in); err != nil {
		return "", fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	return "sparse copy", nil
}

// sparseCopy copies in to out byte for byte, leaving holes where in has them.
func sparseCopy(out, in *os.File) error {
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	if err := out.Truncate(fi.Size()); err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	for e, err := range chain.DataRegions(in) {
		if err != nil {
			return err
		}
		r := io.NewSectionReader(in, e.Offset, e.Length)
		w := io.NewOffsetWriter(out, e.Offset)
		if _, err := io.CopyBuffer(w, r, buf); err != nil {
			return err
		}
	}
	return nil
}
