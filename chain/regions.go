package chain

import (
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// memFile is an open memory image of a known size.
type memFile struct {
	*os.File
	size int64
}

// openMemory opens a memory image and checks its size is whole pages.
func openMemory(path string, pageSize int64) (*memFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open memory: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open memory: %w", err)
	}
	if !fi.Mode().IsRegular() || fi.Size() <= 0 || fi.Size()%pageSize != 0 {
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
// File systems without SEEK_DATA yield one range, the whole memory.
func dataRegions(files []*memFile, size, page int64, fn func(start, end int64) error) error {
	for off := int64(0); off < size; {
		d := size
		for _, f := range files {
			d = min(d, seekData(f, off, size))
		}
		if d >= size {
			return nil
		}
		start, end := d&^(page-1), d
		for end < size {
			next := end
			for _, f := range files {
				next = max(next, seekHole(f, end, size))
			}
			next = min((next+page-1)&^(page-1), size)
			if next == end {
				break
			}
			end = next
		}
		if err := fn(start, end); err != nil {
			return err
		}
		off = end
	}
	return nil
}

func seekData(f *memFile, off, size int64) int64 {
	d, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
	switch {
	case err == unix.ENXIO:
		return size
	case err != nil:
		return off
	}
	return d
}

func seekHole(f *memFile, off, size int64) int64 {
	h, err := unix.Seek(int(f.Fd()), off, unix.SEEK_HOLE)
	if err != nil {
		return size
	}
	return h
}
