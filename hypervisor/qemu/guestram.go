package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// guestRAM reads a paused VM's memory at guest-physical offsets.
type guestRAM interface {
	io.ReaderAt
	// regions are where the memory may hold non-zero pages.
	regions() ([]chain.Extent, error)
	// changed lists the pages that differ from the memory the VM was
	// restored with.
	changed(ctx context.Context) ([]chain.Extent, error)
	Close() error
}

// openRAM opens the VM's memory for a snapshot of kind. A diff needs the
// memory the VM was restored with; a booted VM has none. It waits for a
// copy restore's page hashes, so before the VM is paused is the time.
func (v *VM) openRAM(ctx context.Context, kind hypervisor.SnapshotKind) (guestRAM, error) {
	diff := kind == hypervisor.SnapshotDiff
	if diff && v.staged == nil {
		return nil, fmt.Errorf("diff snapshot of a VM booted, not restored from a chain: %w", hypervisor.ErrNoDiffBase)
	}
	page, size := v.pageSize(), v.shape.MemoryBytes
	if v.memPath == "" {
		return openPrivateRAM(v.PID(), v.staged.MemoryPath(), size, v.written)
	}
	r := &fileRAM{size: size, page: page}
	if diff {
		var err error
		if r.base, err = v.hashes.wait(ctx); err != nil {
			return nil, err
		}
	}
	f, err := os.Open(v.memPath)
	if err != nil {
		return nil, fmt.Errorf("open guest memory: %w", err)
	}
	r.File = f
	return r, nil
}

// pageSize is the guest's page size: its chain's, or the host's for a
// booted VM.
func (v *VM) pageSize() int64 {
	if v.staged != nil {
		return v.staged.Top().PageSize
	}
	return int64(os.Getpagesize())
}

// fileRAM is guest memory QEMU maps shared: a booted VM's file, or a copy
// restore's memfd, compared by page hashes with what it was restored with.
type fileRAM struct {
	*os.File
	size, page int64
	base       *hashBaseline
	// mapped is the memory changed reads through, kept from one call to
	// the next (a live diff's first call, before the guest stops, faults
	// it in) and unmapped by Close, after the guest resumed: tearing the
	// mapping down took as long as hashing through it.
	mapped []byte
}

func (r *fileRAM) Close() error {
	if r.mapped != nil {
		unix.Munmap(r.mapped)
		r.mapped = nil
	}
	return r.File.Close()
}

func (r *fileRAM) regions() ([]chain.Extent, error) {
	var out []chain.Extent
	for e, err := range chain.DataRegions(r.File) {
		if err != nil {
			return nil, fmt.Errorf("find data in guest memory: %w", err)
		}
		start, end := pageRange(e, r.page, r.size)
		out = append(out, chain.Extent{Offset: start, Length: end - start})
	}
	return out, nil
}

// changed compares every page the memory holds data for with its hash,
// and lists the pages that were not zero but are holes now. It reads the
// memory through a mapping, with a worker per CPU: under copy, nothing
// tracks what the guest wrote, so all of its data is hashed while it is
// stopped.
func (r *fileRAM) changed(ctx context.Context) ([]chain.Extent, error) {
	data, err := r.regions()
	if err != nil {
		return nil, err
	}
	if r.mapped == nil {
		if r.mapped, err = unix.Mmap(int(r.Fd()), 0, int(r.size), unix.PROT_READ, unix.MAP_SHARED); err != nil {
			return nil, fmt.Errorf("map guest memory: %w", err)
		}
	}
	out, err := changedMapped(ctx, r.mapped, data, r.base, r.page)
	if err != nil {
		return nil, err
	}
	var prev int64
	for _, e := range append(data, chain.Extent{Offset: r.size}) {
		for off := prev; off < e.Offset; off += r.page {
			if r.base.nonZero(off) {
				out = append(out, chain.Extent{Offset: off, Length: r.page})
			}
		}
		prev = e.End()
	}
	return out, nil
}

// changedMapped lists the pages of exts (sorted) in mem that differ from
// base, splitting the pages among a worker per CPU.
func changedMapped(ctx context.Context, mem []byte, exts []chain.Extent, base baseline, page int64) ([]chain.Extent, error) {
	workers := runtime.GOMAXPROCS(0)
	parts := splitPages(exts, page, workers)
	found := make([][]chain.Extent, len(parts))
	errs := make([]error, len(parts))
	var wg sync.WaitGroup
	for i, part := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			found[i], errs[i] = changedIn(ctx, mem, part, base, page)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return slices.Concat(found...), nil
}

// changedIn lists the pages of exts in mem that differ from base.
func changedIn(ctx context.Context, mem []byte, exts []chain.Extent, base baseline, page int64) ([]chain.Extent, error) {
	var out []chain.Extent
	for _, e := range exts {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		for off := e.Offset; off < e.End(); off += page {
			d, err := base.differs(off, mem[off:off+page])
			if err != nil {
				return nil, err
			}
			if d {
				out = addPage(out, off, page)
			}
		}
	}
	return out, nil
}

// splitPages cuts exts (sorted) into at most n runs of about as many pages,
// in order.
func splitPages(exts []chain.Extent, page int64, n int) [][]chain.Extent {
	var total int64
	for _, e := range exts {
		total += e.Length
	}
	share := max((total/page+int64(n)-1)/int64(n), 1) * page
	var parts [][]chain.Extent
	var cur []chain.Extent
	var size int64
	for _, e := range exts {
		for e.Length > 0 {
			take := min(e.Length, share-size)
			cur = append(cur, chain.Extent{Offset: e.Offset, Length: take})
			e.Offset, e.Length, size = e.Offset+take, e.Length-take, size+take
			if size == share {
				parts, cur, size = append(parts, cur), nil, 0
			}
		}
	}
	if len(cur) > 0 {
		parts = append(parts, cur)
	}
	return parts
}

// privateRAM is an mmap restore's memory: QEMU maps the staged file
// privately, so the pages the guest wrote are QEMU's anonymous pages,
// read through /proc/PID/mem; the others are still the file's.
type privateRAM struct {
	*io.SectionReader
	mem, flat *os.File
	pid       int
	m         mapping
	page      int64
	// base, chunk and pagemap are the buffers changed reads into, made
	// once: a live diff's first call, while the guest runs, faults them
	// in, so the call while it is stopped does not.
	base    *fileBaseline
	chunk   []byte
	pagemap []byte
}

// privateChunk is how much guest memory changed reads and compares at once.
const privateChunk = 1 << 20

func openPrivateRAM(pid int, staged string, size int64, written *pageHashes) (*privateRAM, error) {
	flat, err := os.Open(staged)
	if err != nil {
		return nil, fmt.Errorf("open the staged memory an mmap restore maps: %w", err)
	}
	m, err := fileMapping(pid, flat, size)
	if err != nil {
		flat.Close()
		return nil, err
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		flat.Close()
		return nil, fmt.Errorf("open qemu's memory: %w", err)
	}
	page := written.page
	return &privateRAM{
		SectionReader: io.NewSectionReader(mem, int64(m.addr), size),
		mem:           mem, flat: flat, pid: pid, m: m, page: page,
		base:    &fileBaseline{f: flat, buf: make([]byte, privateChunk), written: written},
		chunk:   make([]byte, privateChunk),
		pagemap: make([]byte, pagemapBufSize(size, page)),
	}, nil
}

func (r *privateRAM) regions() ([]chain.Extent, error) {
	anon, err := anonPages(r.pid, r.m, r.page, r.pagemap)
	if err != nil {
		return nil, err
	}
	for e, err := range chain.DataRegions(r.flat) {
		if err != nil {
			return nil, fmt.Errorf("find data in the staged memory: %w", err)
		}
		start, end := pageRange(e, r.page, r.m.size)
		anon = append(anon, chain.Extent{Offset: start, Length: end - start})
	}
	return anon, nil
}

// changed lists the anonymous pages whose bytes differ from what the
// restore left there (the file's, or a staged delta's): a page written
// back to what it held is not a change. It reads the guest's memory and
// the file a chunk at a time.
func (r *privateRAM) changed(ctx context.Context) ([]chain.Extent, error) {
	anon, err := anonPages(r.pid, r.m, r.page, r.pagemap)
	if err != nil {
		return nil, err
	}
	var out []chain.Extent
	for _, e := range anon {
		for off := e.Offset; off < e.End(); {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			chunk := r.chunk[:min(int64(len(r.chunk)), e.End()-off)]
			if _, err := r.ReadAt(chunk, off); err != nil {
				return nil, fmt.Errorf("read guest memory at %d: %w", off, err)
			}
			if out, err = r.base.changed(out, off, chunk, r.page); err != nil {
				return nil, err
			}
			off += int64(len(chunk))
		}
	}
	return out, nil
}

func (r *privateRAM) Close() error {
	r.flat.Close()
	return r.mem.Close()
}

// addPage appends the page at off to sorted extents, merging it into the
// last one when adjacent.
func addPage(exts []chain.Extent, off, page int64) []chain.Extent {
	if last := len(exts) - 1; last >= 0 && exts[last].End() == off {
		exts[last].Length += page
		return exts
	}
	return append(exts, chain.Extent{Offset: off, Length: page})
}
