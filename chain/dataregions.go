package chain

import (
	"errors"
	"fmt"
	"io"
	"iter"
	"os"

	"golang.org/x/sys/unix"
)

// DataRegions yields, in order, the data extents of f as SEEK_DATA and
// SEEK_HOLE report them, clipped to f's size when iteration starts; every
// byte outside them is a hole and reads as zero. It moves f's file offset,
// so callers read and copy at explicit offsets.
//
// SEEK_DATA failing with ENXIO means only a hole is left: the iteration
// ends. A file system without SEEK_DATA/SEEK_HOLE support (EINVAL or
// EOPNOTSUPP) yields the rest of the file as one extent: its holes read as
// zeros, so treating them as data costs copying, never correctness. Any
// other error is yielded once and ends the iteration.
func DataRegions(f *os.File) iter.Seq2[Extent, error] {
	return func(yield func(Extent, error) bool) {
		fi, err := f.Stat()
		if err != nil {
			yield(Extent{}, fmt.Errorf("stat %s: %w", f.Name(), err))
			return
		}
		for off, size := int64(0), fi.Size(); off < size; {
			e, err := nextData(f, off, size)
			if err == io.EOF {
				return
			}
			if !yield(e, err) || err != nil {
				return
			}
			off = e.End()
		}
	}
}

// nextData returns the data extent at or after off, or io.EOF if only a
// hole is left before size.
func nextData(f *os.File, off, size int64) (Extent, error) {
	fd := int(f.Fd())
	data, err := unix.Seek(fd, off, unix.SEEK_DATA)
	switch {
	case errors.Is(err, unix.ENXIO):
		return Extent{}, io.EOF
	case noHoleSupport(err):
		return Extent{off, size - off}, nil
	case err != nil:
		return Extent{}, fmt.Errorf("seek data in %s at %d: %w", f.Name(), off, err)
	case data >= size:
		return Extent{}, io.EOF
	}
	hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
	switch {
	case noHoleSupport(err):
		hole = size
	case err != nil:
		return Extent{}, fmt.Errorf("seek hole in %s at %d: %w", f.Name(), data, err)
	case hole <= data:
		return Extent{}, fmt.Errorf("seek hole in %s at %d: hole at %d is not past the data", f.Name(), data, hole)
	}
	return Extent{data, min(hole, size) - data}, nil
}

// noHoleSupport reports whether err is lseek refusing SEEK_DATA/SEEK_HOLE
// because the file system does not implement them.
func noHoleSupport(err error) bool {
	return errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP)
}
