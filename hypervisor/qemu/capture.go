package qemu

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// maxCaptured bounds the changed pages a live diff snapshot copies into the
// shim's memory so that the guest runs on while they are written: copying
// 10 MiB takes a few milliseconds, writing and hashing them ten. A larger
// diff is written while the guest is stopped, as a full snapshot is.
const maxCaptured = 64 << 20

// pageBuffer is memory for the changed pages, mapped and faulted in while
// the guest still runs: on these hosts, first touching fresh memory took
// from 1 to 19 ms per 10 MiB, more than the copy itself.
type pageBuffer struct{ b []byte }

// reserve sizes the buffer by the pages changed so far, a quarter and a
// MiB more for what the guest changes before it stops. Only speed depends
// on it: on any error the buffer stays empty and take maps one.
func (p *pageBuffer) reserve(ctx context.Context, ram guestRAM) {
	changed, err := ram.changed(ctx)
	if err != nil {
		return
	}
	n := min(extentBytes(changed)*5/4+1<<20, maxCaptured)
	b, err := hugeBuffer(n)
	if err != nil {
		return
	}
	if unix.Madvise(b, unix.MADV_POPULATE_WRITE) != nil {
		for i := 0; i < len(b); i += unix.Getpagesize() {
			b[i] = 0
		}
	}
	p.b = b
}

// take returns n bytes of the buffer, mapping a larger one if need be.
func (p *pageBuffer) take(n int64) ([]byte, error) {
	if n <= int64(len(p.b)) {
		return p.b[:n], nil
	}
	p.release()
	b, err := hugeBuffer(n)
	p.b = b
	return b, err
}

func (p *pageBuffer) release() {
	if p.b != nil {
		unix.Munmap(p.b)
		p.b = nil
	}
}

// hugeBuffer maps n bytes of anonymous memory, in transparent huge pages
// where the host allows: 2 MiB faults are far fewer than 4 KiB ones.
func hugeBuffer(n int64) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	b, err := unix.Mmap(-1, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("map a buffer for the changed pages: %w", err)
	}
	// Only speed depends on it: without huge pages the buffer still works.
	unix.Madvise(b, unix.MADV_HUGEPAGE)
	return b, nil
}

func extentBytes(exts []chain.Extent) int64 {
	var n int64
	for _, e := range exts {
		n += e.Length
	}
	return n
}

// capturedPages are guest pages copied out of a stopped VM, read back at
// their guest-physical offsets.
type capturedPages struct {
	exts   []chain.Extent // sorted, not overlapping
	starts []int64        // where each extent's bytes begin in data
	data   []byte
}

// capturePages copies the pages of exts (whole pages, not overlapping)
// from mem into buf, or reports false when they are more than maxCaptured
// bytes.
func capturePages(mem io.ReaderAt, exts []chain.Extent, buf *pageBuffer) (*capturedPages, bool, error) {
	total := extentBytes(exts)
	if total > maxCaptured {
		return nil, false, nil
	}
	data, err := buf.take(total)
	if err != nil {
		return nil, false, err
	}
	c := &capturedPages{exts: slices.Clone(exts), data: data}
	slices.SortFunc(c.exts, func(a, b chain.Extent) int { return cmp.Compare(a.Offset, b.Offset) })
	var at int64
	for _, e := range c.exts {
		if _, err := mem.ReadAt(c.data[at:at+e.Length], e.Offset); err != nil {
			return nil, false, fmt.Errorf("copy the changed pages at %d: %w", e.Offset, err)
		}
		c.starts = append(c.starts, at)
		at += e.Length
	}
	return c, true, nil
}

// ReadAt reads captured bytes only: a read may span adjacent extents, but
// not a page that was not captured.
func (c *capturedPages) ReadAt(p []byte, off int64) (int, error) {
	n := 0
	for n < len(p) {
		at := off + int64(n)
		i, _ := slices.BinarySearchFunc(c.exts, at, func(e chain.Extent, at int64) int {
			return cmp.Compare(e.End(), at+1)
		})
		if i == len(c.exts) || c.exts[i].Offset > at {
			return n, fmt.Errorf("read captured pages at %d: not captured", at)
		}
		e := c.exts[i]
		n += copy(p[n:], c.data[c.starts[i]+at-e.Offset:c.starts[i]+e.Length])
	}
	return n, nil
}
