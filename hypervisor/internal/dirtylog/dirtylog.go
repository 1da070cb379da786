// Package dirtylog turns a hypervisor's diff snapshots, which hold the
// pages dirtied since the VM's previous snapshot, into cocoon's diff links,
// which hold the pages changed since the VM's restore: a Log merges each
// diff snapshot's pages into a sparse file of the VM's memory size (in its
// run directory) and knows which pages it holds.
package dirtylog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// Log is the pages a VM dirtied since its restore, with their latest bytes.
type Log struct {
	f     *os.File
	size  int64
	page  int64
	pages []chain.Extent // dirtied pages, unsorted, may overlap
}

// New creates the log's file at path for a memory of size bytes.
func New(path string, size, page int64) (*Log, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create dirty page log: %w", err)
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("size dirty page log: %w", err)
	}
	return &Log{f: f, size: size, page: page}, nil
}

// Merge copies into the log the pages of mem, a diff snapshot's memory
// file: the memory's size, the dirtied pages at their offsets, holes
// elsewhere. A file system that cannot tell holes from data is an error:
// taking its holes for pages would record zeros over the guest's memory.
func (l *Log) Merge(ctx context.Context, mem string) error {
	f, err := os.Open(mem)
	if err != nil {
		return fmt.Errorf("open diff snapshot memory: %w", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || fi.Size() != l.size {
		return fmt.Errorf("diff snapshot memory %s is not %d bytes (%v)", mem, l.size, err)
	}
	buf := make([]byte, 1<<20)
	for off := int64(0); off < l.size; {
		start, end, err := nextData(f, off, l.size)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("find the pages of %s: %w", mem, err)
		}
		start, end = start&^(l.page-1), min((end+l.page-1)&^(l.page-1), l.size)
		if err := l.copyRange(ctx, f, start, end, buf); err != nil {
			return err
		}
		off = end
	}
	return nil
}

// nextData is the data range at or after off: SEEK_DATA, then SEEK_HOLE.
func nextData(f *os.File, off, size int64) (int64, int64, error) {
	start, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
	if errors.Is(err, unix.ENXIO) || (err == nil && start >= size) {
		return 0, 0, io.EOF
	}
	if err != nil {
		return 0, 0, err
	}
	end, err := unix.Seek(int(f.Fd()), start, unix.SEEK_HOLE)
	if err != nil {
		return 0, 0, err
	}
	return start, min(end, size), nil
}

// copyRange copies [start, end) of src into the log and records it.
func (l *Log) copyRange(ctx context.Context, src *os.File, start, end int64, buf []byte) error {
	for off := start; off < end; {
		if err := ctx.Err(); err != nil {
			return err
		}
		b := buf[:min(int64(len(buf)), end-off)]
		if _, err := src.ReadAt(b, off); err != nil {
			return fmt.Errorf("read diff snapshot memory at %d: %w", off, err)
		}
		if _, err := l.f.WriteAt(b, off); err != nil {
			return fmt.Errorf("write dirty page log at %d: %w", off, err)
		}
		off += int64(len(b))
	}
	l.pages = append(l.pages, chain.Extent{Offset: start, Length: end - start})
	return nil
}

// MergeChanged merges the pages in which full (a whole memory dump) differs
// from restored (the memory the VM was restored with): a hypervisor whose
// first diff snapshot is a full baseline.
func (l *Log) MergeChanged(ctx context.Context, full, restored string) error {
	a, err := os.Open(full)
	if err != nil {
		return fmt.Errorf("open memory dump: %w", err)
	}
	defer a.Close()
	b, err := os.Open(restored)
	if err != nil {
		return fmt.Errorf("open restored memory: %w", err)
	}
	defer b.Close()
	ca, cb := make([]byte, 1<<20), make([]byte, 1<<20)
	for off := int64(0); off < l.size; {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := min(int64(len(ca)), l.size-off)
		if _, err := a.ReadAt(ca[:n], off); err != nil {
			return fmt.Errorf("read memory dump at %d: %w", off, err)
		}
		if _, err := b.ReadAt(cb[:n], off); err != nil {
			return fmt.Errorf("read restored memory at %d: %w", off, err)
		}
		for p := int64(0); p < n; p += l.page {
			page := ca[p : p+l.page]
			if bytes.Equal(page, cb[p:p+l.page]) {
				continue
			}
			if _, err := l.f.WriteAt(page, off+p); err != nil {
				return fmt.Errorf("write dirty page log at %d: %w", off+p, err)
			}
			l.pages = append(l.pages, chain.Extent{Offset: off + p, Length: l.page})
		}
		off += n
	}
	return nil
}

// WriteLink writes into dir the diff link, on parent, of every page the log
// holds: what changed since the restore.
func (l *Log) WriteLink(ctx context.Context, parent *chain.Link, meta chain.Meta, dir string) (*chain.Link, error) {
	return chain.WriteDiffOn(ctx, l.f, l.pages, parent, meta, dir, nil)
}

// Close removes the log.
func (l *Log) Close() error {
	err := l.f.Close()
	if rerr := os.Remove(l.f.Name()); err == nil {
		err = rerr
	}
	return err
}
