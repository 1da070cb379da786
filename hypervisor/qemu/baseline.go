package qemu

import (
	"bytes"
	"context"
	"fmt"
	"hash/maphash"
	"io"
	"os"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// baseline is the guest memory a VM was restored with, against which a
// diff snapshot tells the pages that changed since.
type baseline interface {
	// differs reports whether page, read at off, differs from the
	// restored memory's page there.
	differs(off int64, page []byte) (bool, error)
}

// fileBaseline is an immutable memory file: the staged memory an mmap
// restore maps privately, there for the VM's whole life, with the hashes
// of the pages the restore wrote over it from staged deltas.
type fileBaseline struct {
	f io.ReaderAt
	// buf holds f's range matching a chunk of memory being compared, read
	// at once rather than a page at a time.
	buf     []byte
	written *pageHashes
}

// changed appends to out (sorted) the pages of chunk, read at off, that
// differ from the restored memory there; chunk is whole pages, at most
// len(b.buf) bytes. f is read once, from the first page that no staged
// delta wrote.
func (b *fileBaseline) changed(out []chain.Extent, off int64, chunk []byte, page int64) ([]chain.Extent, error) {
	var old []byte
	for p := int64(0); p < int64(len(chunk)); p += page {
		cur := chunk[p : p+page]
		if h, ok := b.written.lookup(off + p); ok {
			if b.written.sum(cur) != h {
				out = addPage(out, off+p, page)
			}
			continue
		}
		if old == nil {
			old = b.buf[:len(chunk)]
			if _, err := b.f.ReadAt(old[p:], off+p); err != nil {
				return nil, fmt.Errorf("read restored memory at %d: %w", off+p, err)
			}
		}
		if !bytes.Equal(old[p:p+page], cur) {
			out = addPage(out, off+p, page)
		}
	}
	return out, nil
}

// hashBaseline holds a keyed 64-bit hash of every page of the restored
// memory: a copy restore's staged file is released once the guest is up,
// and keeping the hashes (8 bytes a page) is what lets a later diff find
// the changed pages without it. The seed is random per VM and stays in the
// shim, so a guest cannot make a changed page hash as the old one did; a
// changed page matches its old hash by accident with probability 2^-64.
type hashBaseline struct {
	seed     maphash.Seed
	page     int64
	hashes   []uint64
	zeroHash uint64
}

// pageHashes are keyed hashes of the pages a restore wrote into the guest
// from staged deltas, by page offset: what those pages held at the restore.
type pageHashes struct {
	seed maphash.Seed
	page int64
	m    map[int64]uint64
}

func newPageHashes(page int64) *pageHashes {
	return &pageHashes{seed: maphash.MakeSeed(), page: page, m: map[int64]uint64{}}
}

func (h *pageHashes) sum(page []byte) uint64 { return maphash.Bytes(h.seed, page) }

// add records the pages of data, written at off (a later write of a page
// replaces an earlier one, as it did in the guest).
func (h *pageHashes) add(off int64, data []byte) {
	for p := int64(0); p < int64(len(data)); p += h.page {
		h.m[off+p] = h.sum(data[p : p+h.page])
	}
}

func (h *pageHashes) lookup(off int64) (uint64, bool) {
	if h == nil {
		return 0, false
	}
	v, ok := h.m[off]
	return v, ok
}

func newHashBaseline(size int64, written *pageHashes) *hashBaseline {
	page := written.page
	b := &hashBaseline{seed: written.seed, page: page, hashes: make([]uint64, size/page)}
	b.zeroHash = maphash.Bytes(b.seed, make([]byte, page))
	for i := range b.hashes {
		b.hashes[i] = b.zeroHash
	}
	return b
}

func (b *hashBaseline) differs(off int64, page []byte) (bool, error) {
	return maphash.Bytes(b.seed, page) != b.hashes[off/b.page], nil
}

// nonZero reports whether the restored page at off was not all zeros.
func (b *hashBaseline) nonZero(off int64) bool { return b.hashes[off/b.page] != b.zeroHash }

// add hashes the pages of b read at off.
func (b *hashBaseline) add(off int64, data []byte) {
	for p := int64(0); p < int64(len(data)); p += b.page {
		b.hashes[(off+p)/b.page] = maphash.Bytes(b.seed, data[p:p+b.page])
	}
}

// hashFile hashes the data extents of f, a memory of size bytes (its holes
// are zero pages and keep the zero hash), then the pages written over it.
func hashFile(ctx context.Context, f *os.File, size int64, written *pageHashes) (*hashBaseline, error) {
	b := newHashBaseline(size, written)
	page := b.page
	buf := make([]byte, 1<<20)
	for e, err := range chain.DataRegions(f) {
		if err != nil {
			return nil, fmt.Errorf("find data in restored memory: %w", err)
		}
		start, end := pageRange(e, page, size)
		for off := start; off < end; {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			chunk := buf[:min(int64(len(buf)), end-off)]
			if _, err := f.ReadAt(chunk, off); err != nil {
				return nil, fmt.Errorf("read restored memory at %d: %w", off, err)
			}
			b.add(off, chunk)
			off += int64(len(chunk))
		}
	}
	for off, h := range written.m {
		b.hashes[off/page] = h
	}
	return b, nil
}

// pageRange widens e to whole pages inside a memory of size bytes.
func pageRange(e chain.Extent, page, size int64) (start, end int64) {
	return e.Offset &^ (page - 1), min((e.End()+page-1)&^(page-1), size)
}

// pendingHash is a hashBaseline being made in the background, so a copy
// restore does not wait for it: only a diff snapshot does.
type pendingHash struct {
	cancel context.CancelFunc
	done   chan struct{}
	b      *hashBaseline
	err    error
}

// hashLater hashes f (size bytes) and the pages written over it in the
// background, and closes f.
func hashLater(f *os.File, size int64, written *pageHashes) *pendingHash {
	ctx, cancel := context.WithCancel(context.Background())
	p := &pendingHash{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		defer f.Close()
		p.b, p.err = hashFile(ctx, f, size, written)
	}()
	return p
}

// wait returns the baseline once made.
func (p *pendingHash) wait(ctx context.Context) (*hashBaseline, error) {
	select {
	case <-p.done:
		if p.err != nil {
			return nil, fmt.Errorf("hash the restored memory: %w", p.err)
		}
		return p.b, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for the restored memory's hashes: %w", ctx.Err())
	}
}

// stop ends the hashing and waits for it.
func (p *pendingHash) stop() {
	p.cancel()
	<-p.done
}
