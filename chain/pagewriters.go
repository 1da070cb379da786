package chain

import (
	"context"
	"errors"
	"fmt"
	"io"
)

// WriteFullFrom and WriteDiffOn read guest memory at guest-physical offsets
// of mem: a file, a memfd, or another process's mapping (/proc/PID/mem).
// written, if set, runs once every page is written (to the page cache) and
// before the link is made durable and link.json written: a snapshot of a
// paused VM resumes it there, since nothing reads its memory after.

// WriteFullFrom writes into outDir a full link of mem, a memory of size
// bytes: every non-zero page inside regions (any order; overlaps merged;
// whole pages in bounds). Pages outside regions are zero and not read.
func WriteFullFrom(ctx context.Context, mem io.ReaderAt, size int64, regions []Extent, meta Meta, outDir string, written func() error) (*Link, error) {
	l := meta.link(KindFull, size, nil)
	return writePages(ctx, mem, regions, l, nil, outDir, func(p []byte) bool { return !isZero(p) }, written)
}

// WriteDiffOn writes into outDir a diff link on parent holding exactly the
// pages dirty of mem (any order; overlaps merged; whole pages in bounds),
// zero or not. parent is the link the memory was restored from, as a
// staged chain describes it (it needs its ID).
func WriteDiffOn(ctx context.Context, mem io.ReaderAt, dirty []Extent, parent *Link, meta Meta, outDir string, written func() error) (*Link, error) {
	if parent == nil || parent.ID() == "" {
		return nil, errors.New("write diff link: the parent link has no ID (read it from disk or a staged chain)")
	}
	l := meta.link(KindDiff, parent.MemoryBytes, parent)
	return writePages(ctx, mem, dirty, l, parent, outDir, func([]byte) bool { return true }, written)
}

// writePages writes link l of the pages in exts of mem for which keep is
// true.
func writePages(ctx context.Context, mem io.ReaderAt, exts []Extent, l, parent *Link, outDir string, keep func([]byte) bool, written func() error) (*Link, error) {
	if err := l.checkHeader(); err != nil {
		return nil, fmt.Errorf("write link: %w", err)
	}
	exts, err := normalizeExtents(exts, l.MemoryBytes, l.PageSize)
	if err != nil {
		return nil, fmt.Errorf("write link: pages: %w", err)
	}
	w, err := startLink(outDir, l, parent)
	if err != nil {
		return nil, err
	}
	page := l.PageSize
	buf := make([]byte, chunkSize(page))
	for _, e := range exts {
		for off := e.Offset; off < e.End(); {
			if err := ctx.Err(); err != nil {
				w.abort()
				return nil, err
			}
			b := buf[:min(int64(len(buf)), e.End()-off)]
			if _, err := mem.ReadAt(b, off); err != nil {
				w.abort()
				return nil, fmt.Errorf("write link: read memory at %d: %w", off, err)
			}
			if err := addRuns(w, off, page, len(b), func(p int) bool { return keep(b[p : int64(p)+page]) }, b); err != nil {
				w.abort()
				return nil, err
			}
			off += int64(len(b))
		}
	}
	return w.finishAfter(l, written)
}
