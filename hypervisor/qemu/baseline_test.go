package qemu

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// fileBaseline.changed compares a chunk with the file's bytes, or with
// the hash of what a staged delta wrote there, page by page.
func TestFileBaselineChanged(t *testing.T) {
	const page = 4096
	flat := numberedPages(8, page)
	written := newPageHashes(page)
	delta := bytes.Repeat([]byte{0xd0}, page)
	written.add(2*page, delta)
	written.add(5*page, delta)
	e := func(p, n int64) chain.Extent { return chain.Extent{Offset: p * page, Length: n * page} }
	tests := []struct {
		name string
		// change edits the restored memory (flat with the deltas) into
		// the guest's, of which pages from (1 if zero) to 6 are compared.
		change func(mem []byte)
		from   int64
		want   []chain.Extent
	}{
		{"unchanged", func([]byte) {}, 0, nil},
		{"file pages", func(mem []byte) { mem[1*page] ^= 1; mem[4*page+7] ^= 1; mem[4*page-1] ^= 1 }, 0, []chain.Extent{e(1, 1), e(3, 2)}},
		{"delta pages", func(mem []byte) { mem[2*page+9] ^= 1; mem[5*page] ^= 1 }, 0, []chain.Extent{e(2, 1), e(5, 1)}},
		{"back to the file under a delta", func(mem []byte) { copy(mem[2*page:3*page], flat[2*page:]) }, 0, []chain.Extent{e(2, 1)}},
		{"last page", func(mem []byte) { mem[7*page-1] ^= 1 }, 0, []chain.Extent{e(6, 1)}},
		{"outside the chunk", func(mem []byte) { mem[0] ^= 1; mem[7*page] ^= 1 }, 0, nil},
		{"chunk from a delta page", func(mem []byte) { mem[3*page+1] ^= 1; mem[6*page] ^= 1 }, 2, []chain.Extent{e(3, 1), e(6, 1)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mem := bytes.Clone(flat)
			copy(mem[2*page:], delta)
			copy(mem[5*page:], delta)
			tt.change(mem)
			b := &fileBaseline{f: bytes.NewReader(flat), buf: make([]byte, 6*page), written: written}
			from := max(tt.from, 1) * page
			got, err := b.changed(nil, from, mem[from:7*page], page)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("changed %v, want %v", got, tt.want)
			}
		})
	}
}
