package chain

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"
)

// WriteFull writes a full link of the memory image memPath into outDir:
// every non-zero page. Holes in memPath are skipped without reading.
func WriteFull(ctx context.Context, memPath string, meta Meta, outDir string) (*Link, error) {
	mem, err := openMemory(memPath, meta.pageSize())
	if err != nil {
		return nil, err
	}
	defer mem.Close()
	l := meta.link(KindFull, mem.size, nil)
	w, err := startLink(outDir, l, nil)
	if err != nil {
		return nil, err
	}
	page := l.PageSize
	bufs := [][]byte{make([]byte, chunkSize(page))}
	files := []*memFile{mem}
	err = dataRegions(files, mem.size, page, func(start, end int64) error {
		return forEachChunk(files, start, end, bufs, func(off int64, b [][]byte) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			return addRuns(w, off, page, len(b[0]), func(p int) bool {
				return !isZero(b[0][p : int64(p)+page])
			}, b[0])
		})
	})
	if err != nil {
		w.abort()
		return nil, fmt.Errorf("write full link of %s: %w", memPath, err)
	}
	return w.finish(l)
}

// WriteDiff writes into outDir a diff link of memPath against its parent:
// every page that differs from parentMemPath, the parent chain's flattened
// memory, including pages that became zero. parentDir is the parent link.
func WriteDiff(ctx context.Context, memPath, parentMemPath, parentDir string, meta Meta, outDir string) (*Link, error) {
	parent, mem, err := openDiff(memPath, parentDir, meta)
	if err != nil {
		return nil, err
	}
	defer mem.Close()
	pmem, err := openMemory(parentMemPath, meta.pageSize())
	if err != nil {
		return nil, err
	}
	defer pmem.Close()
	if pmem.size != parent.MemoryBytes {
		return nil, fmt.Errorf("parent memory %s: %d bytes, parent link says %d", parentMemPath, pmem.size, parent.MemoryBytes)
	}
	l := meta.link(KindDiff, mem.size, parent)
	w, err := startLink(outDir, l, parent)
	if err != nil {
		return nil, err
	}
	page := l.PageSize
	bufs := [][]byte{make([]byte, chunkSize(page)), make([]byte, chunkSize(page))}
	files := []*memFile{mem, pmem}
	err = dataRegions(files, mem.size, page, func(start, end int64) error {
		return forEachChunk(files, start, end, bufs, func(off int64, b [][]byte) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			return addRuns(w, off, page, len(b[0]), func(p int) bool {
				q := int64(p) + page
				return !bytes.Equal(b[0][p:q], b[1][p:q])
			}, b[0])
		})
	})
	if err != nil {
		w.abort()
		return nil, fmt.Errorf("write diff link of %s: %w", memPath, err)
	}
	return w.finish(l)
}

// openDiff reads the parent link a diff is made against and opens memPath.
func openDiff(memPath, parentDir string, meta Meta) (*Link, *memFile, error) {
	parent, err := ReadLink(parentDir)
	if err != nil {
		return nil, nil, err
	}
	mem, err := openMemory(memPath, meta.pageSize())
	if err != nil {
		return nil, nil, err
	}
	return parent, mem, nil
}

// WriteDiffPages writes into outDir a diff link of memPath holding exactly
// the pages in dirty (any order; overlaps merged; whole pages in bounds).
// parentDir is the parent link.
func WriteDiffPages(ctx context.Context, memPath string, dirty []Extent, parentDir string, meta Meta, outDir string) (*Link, error) {
	parent, mem, err := openDiff(memPath, parentDir, meta)
	if err != nil {
		return nil, err
	}
	defer mem.Close()
	l := meta.link(KindDiff, mem.size, parent)
	l, err = writePages(ctx, mem, dirty, l, parent, outDir, func([]byte) bool { return true }, nil)
	if err != nil {
		return nil, fmt.Errorf("write diff link of %s: %w", memPath, err)
	}
	return l, nil
}

// addRuns adds to w each run of consecutive pages of b (at off) for which
// keep is true.
func addRuns(w *linkWriter, off, page int64, n int, keep func(p int) bool, b []byte) error {
	ps := int(page)
	for p := 0; p < n; {
		if !keep(p) {
			p += ps
			continue
		}
		q := p + ps
		for q < n && keep(q) {
			q += ps
		}
		if err := w.add(off+int64(p), b[p:q]); err != nil {
			return err
		}
		p = q
	}
	return nil
}

// normalizeExtents sorts and merges extents after checking each is whole
// pages inside a memory of size bytes.
func normalizeExtents(in []Extent, size, page int64) ([]Extent, error) {
	exts := slices.Clone(in)
	for _, e := range exts {
		switch {
		case e.Offset < 0 || e.Length <= 0 || e.Offset%page != 0 || e.Length%page != 0:
			return nil, fmt.Errorf("extent offset %d length %d is not whole %d-byte pages", e.Offset, e.Length, page)
		case e.Offset >= size || e.Length > size-e.Offset:
			return nil, fmt.Errorf("extent offset %d length %d is out of bounds of the %d-byte memory", e.Offset, e.Length, size)
		}
	}
	slices.SortFunc(exts, func(a, b Extent) int { return cmp.Compare(a.Offset, b.Offset) })
	var out []Extent
	for _, e := range exts {
		if k := len(out) - 1; k >= 0 && e.Offset <= out[k].End() {
			out[k].Length = max(out[k].End(), e.End()) - out[k].Offset
			continue
		}
		out = append(out, e)
	}
	return out, nil
}
