package chain

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"

	"github.com/opencontainers/go-digest"
)

// extentsMagic opens memory.extents; the format is in the package doc.
const extentsMagic = "COCOONEX"

const (
	extentsVersion    = 1
	extentsHeaderSize = 16
	extentRecordSize  = 16
)

// Extent is a byte range of guest memory.
type Extent struct {
	Offset int64 `json:"offset"`
	Length int64 `json:"length"`
}

// End is the offset just past the extent.
func (e Extent) End() int64 { return e.Offset + e.Length }

// extentWriter streams extents to memory.extents, merging adjacent ones.
type extentWriter struct {
	w     *bufio.Writer
	h     hash.Hash
	cur   Extent
	count int64
}

func newExtentWriter(w io.Writer) (*extentWriter, error) {
	h := digest.SHA256.Hash()
	ew := &extentWriter{w: bufio.NewWriter(io.MultiWriter(w, h)), h: h}
	var hdr [extentsHeaderSize]byte
	copy(hdr[:], extentsMagic)
	binary.LittleEndian.PutUint32(hdr[8:], extentsVersion)
	if _, err := ew.w.Write(hdr[:]); err != nil {
		return nil, err
	}
	return ew, nil
}

// add appends e; callers add in increasing, non-overlapping order.
func (ew *extentWriter) add(e Extent) error {
	if ew.cur.Length > 0 && ew.cur.End() == e.Offset {
		ew.cur.Length += e.Length
		return nil
	}
	if err := ew.flushCur(); err != nil {
		return err
	}
	ew.cur = e
	return nil
}

func (ew *extentWriter) flushCur() error {
	if ew.cur.Length == 0 {
		return nil
	}
	var rec [extentRecordSize]byte
	binary.LittleEndian.PutUint64(rec[:8], uint64(ew.cur.Offset))
	binary.LittleEndian.PutUint64(rec[8:], uint64(ew.cur.Length))
	ew.count++
	ew.cur = Extent{}
	_, err := ew.w.Write(rec[:])
	return err
}

// close flushes and returns the record count and the file's digest.
func (ew *extentWriter) close() (int64, digest.Digest, error) {
	if err := ew.flushCur(); err != nil {
		return 0, "", err
	}
	if err := ew.w.Flush(); err != nil {
		return 0, "", err
	}
	return ew.count, digest.NewDigest(digest.SHA256, ew.h), nil
}

// maxExtentsSize bounds memory.extents of a memory of memBytes in pages of
// pageSize: at most one record per page (adjacent ones are merged).
func maxExtentsSize(memBytes, pageSize int64) int64 {
	return extentsHeaderSize + memBytes/pageSize*extentRecordSize
}

// readExtents streams the records of an extents file of at most maxSize
// bytes to fn, checking the header and the record framing, and returns the
// count and file digest.
func readExtents(path string, maxSize int64, fn func(Extent) error) (int64, digest.Digest, error) {
	f, err := OpenLinkFile(path, maxSize)
	if err != nil {
		return 0, "", fmt.Errorf("read extents: %w", err)
	}
	defer f.Close()
	h := digest.SHA256.Hash()
	r := bufio.NewReader(io.TeeReader(f, h))
	var hdr [extentsHeaderSize]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, "", fmt.Errorf("%s: read header: %w", path, err)
	}
	if string(hdr[:8]) != extentsMagic {
		return 0, "", fmt.Errorf("%s: bad magic %q (want %q)", path, hdr[:8], extentsMagic)
	}
	if v := binary.LittleEndian.Uint32(hdr[8:]); v != extentsVersion {
		return 0, "", fmt.Errorf("%s: unknown extents format version %d (want %d)", path, v, extentsVersion)
	}
	var n int64
	var rec [extentRecordSize]byte
	for ; ; n++ {
		if _, err := io.ReadFull(r, rec[:]); err == io.EOF {
			break
		} else if errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, "", fmt.Errorf("%s: record %d is truncated", path, n)
		} else if err != nil {
			return 0, "", fmt.Errorf("read %s: %w", path, err)
		}
		e := Extent{int64(binary.LittleEndian.Uint64(rec[:8])), int64(binary.LittleEndian.Uint64(rec[8:]))}
		if err := fn(e); err != nil {
			return 0, "", fmt.Errorf("%s: extent %d: %w", path, n, err)
		}
	}
	return n, digest.NewDigest(digest.SHA256, h), nil
}

// extentChecker enforces the layout rules on a stream of extents.
type extentChecker struct {
	memBytes, pageSize int64
	prev               Extent
	n                  int64
	sum                int64
}

func (c *extentChecker) check(e Extent) error {
	switch {
	case e.Offset < 0 || e.Length <= 0:
		return fmt.Errorf("offset %d length %d: offset must be >= 0 and length > 0", e.Offset, e.Length)
	case e.Offset%c.pageSize != 0 || e.Length%c.pageSize != 0:
		return fmt.Errorf("offset %d length %d is not aligned to the page size %d", e.Offset, e.Length, c.pageSize)
	case e.Offset >= c.memBytes || e.Length > c.memBytes-e.Offset:
		return fmt.Errorf("offset %d length %d is out of bounds of the %d-byte memory", e.Offset, e.Length, c.memBytes)
	case c.n > 0 && e.Offset < c.prev.Offset:
		return fmt.Errorf("offset %d is before the previous extent at %d: extents must be sorted", e.Offset, c.prev.Offset)
	case c.n > 0 && e.Offset < c.prev.End():
		return fmt.Errorf("offset %d overlaps the previous extent [%d, %d)", e.Offset, c.prev.Offset, c.prev.End())
	case c.n > 0 && e.Offset == c.prev.End():
		return fmt.Errorf("offset %d adjoins the previous extent: adjacent extents must be merged", e.Offset)
	}
	c.prev = e
	c.n++
	c.sum += e.Length
	return nil
}
