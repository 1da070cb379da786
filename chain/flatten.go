package chain

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

const (
	// ioChunk is the size of the one buffer Flatten and the writers reuse.
	ioChunk = 1 << 20
	// zeroBlock is the granularity at which Flatten looks for zero bytes
	// to leave as holes; extents are whole pages, so whole blocks too.
	zeroBlock = 4096
)

var zeros = make([]byte, zeroBlock)

// Flatten replays the links in linkDirs, oldest first, into one memory file
// at outPath: sparse where the memory is zero, mode 0444, published by
// rename from a temp file in the same directory, and fsynced. The whole
// chain is validated before anything is written, and each link's data
// digest is verified while it streams; on any error no file is left at
// outPath.
func Flatten(ctx context.Context, linkDirs []string, outPath string) error {
	return flatten(ctx, linkDirs, outPath, publish)
}

// FlattenUnsynced is Flatten without the fsync: the file is whole once
// at outPath, but a host crash may tear it, so its owner must drop it
// after one (the snapshotter's flat cache, after a reboot). A first
// restore then does not wait for the disk to take the whole memory.
func FlattenUnsynced(ctx context.Context, linkDirs []string, outPath string) error {
	return flatten(ctx, linkDirs, outPath, rename)
}

func flatten(ctx context.Context, linkDirs []string, outPath string, put func(*os.File, string, os.FileMode) error) error {
	links, err := ValidateChain(linkDirs)
	if err != nil {
		return fmt.Errorf("flatten: %w", err)
	}
	f, err := createTemp(outPath)
	if err != nil {
		return fmt.Errorf("flatten: %w", err)
	}
	if err := f.Truncate(links[0].MemoryBytes); err != nil {
		discard(f)
		return fmt.Errorf("flatten: size %s: %w", f.Name(), err)
	}
	br := bufio.NewReaderSize(nil, ioChunk)
	for i, l := range links {
		if err := replay(ctx, f, linkDirs[i], l, i == 0, br); err != nil {
			discard(f)
			return fmt.Errorf("flatten: %w", err)
		}
	}
	if err := put(f, outPath, 0o444); err != nil {
		return fmt.Errorf("flatten: %w", err)
	}
	return nil
}

// replay writes one link's extents into out. fresh means out holds only
// holes, so zero pages need no write. br is reused across links: the data
// is read in large chunks whatever the extents' sizes, and hashed and
// written from br's buffer without a copy.
func replay(ctx context.Context, out *os.File, dir string, l *Link, fresh bool, br *bufio.Reader) error {
	return readPages(ctx, filepath.Join(dir, ExtentsFile), filepath.Join(dir, DataFile), l, br, func(off int64, b []byte) error {
		return writeBlocks(out, off, b, fresh)
	})
}

// writeBlocks writes b at off, leaving zero blocks as holes: skipped when
// out is fresh, punched otherwise (a diff may zero a page an older link set).
func writeBlocks(out *os.File, off int64, b []byte, fresh bool) error {
	for len(b) > 0 {
		zero := isZero(b[:zeroBlock])
		n := zeroBlock
		for n < len(b) && isZero(b[n:n+zeroBlock]) == zero {
			n += zeroBlock
		}
		var err error
		switch {
		case !zero:
			_, err = out.WriteAt(b[:n], off)
		case !fresh:
			err = punchHole(out, off, int64(n))
		}
		if err != nil {
			return fmt.Errorf("write %s at %d: %w", out.Name(), off, err)
		}
		off += int64(n)
		b = b[n:]
	}
	return nil
}

func isZero(b []byte) bool {
	for len(b) > zeroBlock {
		if !bytes.Equal(b[:zeroBlock], zeros) {
			return false
		}
		b = b[zeroBlock:]
	}
	return bytes.Equal(b, zeros[:len(b)])
}

// punchHole zeroes a range by deallocating it; file systems without hole
// punching get zeros written instead, which reads back the same.
func punchHole(f *os.File, off, n int64) error {
	err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
	if !errors.Is(err, unix.EOPNOTSUPP) {
		return err
	}
	for n > 0 {
		k := min(n, int64(len(zeros)))
		if _, err := f.WriteAt(zeros[:k], off); err != nil {
			return err
		}
		off += k
		n -= k
	}
	return nil
}
