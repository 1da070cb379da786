package chain

import (
	"fmt"
	"io"
	"math"
	"os"
)

// memFile is an open memory image of a known size.
type memFile struct {
	*os.File
	size int64
}

// openMemory opens a memory image, a regular file (opened without
// blocking), and checks its size is whole pages.
func openMemory(path string, pageSize int64) (*memFile, error) {
	f, err := openRegular(path, 0, math.MaxInt64)
	if err != nil {
		return nil, fmt.Errorf("open memory: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open memory: %w", err)
	}
	if fi.Size() <= 0 || fi.Size()%pageSize != 0 {
		f.Close()
		return nil, fmt.Errorf("memory %s: %d bytes is not a non-empty regular file of whole %d-byte pages", path, fi.Size(), pageSize)
	}
	return &memFile{File: f, size: fi.Size()}, nil
}

// forEachChunk reads [start, end) of each file in chunks of len(bufs[i])
// (a multiple of page) and calls fn with the chunk offset and the bytes.
func forEachChunk(files []*memFile, start, end int64, bufs [][]byte, fn func(off int64, b [][]byte) error) error {
	cur := make([][]byte, len(files))
	for off := start; off < end; {
		n := min(int64(len(bufs[0])), end-off)
		for i, f := range files {
			cur[i] = bufs[i][:n]
			if _, err := f.ReadAt(cur[i], off); err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return fmt.Errorf("read %s at %d: %w", f.Name(), off, err)
			}
		}
		if err := fn(off, cur); err != nil {
			return err
		}
		off += n
	}
	return nil
}

// dataRegions calls fn, in order, with page-aligned ranges that cover every
// byte any of files may hold data at; holes all files share are skipped.
// Every file's extents are listed first (16 bytes each, at most one per
// page) so that normalizeExtents can merge them.
func dataRegions(files []*memFile, size, page int64, fn func(start, end int64) error) error {
	var all []Extent
	for _, f := range files {
		for e, err := range DataRegions(f.File) {
			if err != nil {
				return err
			}
			start, end := e.Offset&^(page-1), min((e.End()+page-1)&^(page-1), size)
			if start < end {
				all = append(all, Extent{start, end - start})
			}
		}
	}
	regions, err := normalizeExtents(all, size, page)
	if err != nil {
		return err
	}
	for _, r := range regions {
		if err := fn(r.Offset, r.End()); err != nil {
			return err
		}
	}
	return nil
}
