package qemu

import (
	"reflect"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

func TestSplitPages(t *testing.T) {
	const p = 4096
	e := func(page, n int64) chain.Extent { return chain.Extent{Offset: page * p, Length: n * p} }
	exts := []chain.Extent{e(0, 3), e(10, 1), e(20, 4)}
	tests := []struct {
		n    int
		want [][]chain.Extent
	}{
		{1, [][]chain.Extent{exts}},
		{2, [][]chain.Extent{{e(0, 3), e(10, 1)}, {e(20, 4)}}},
		{3, [][]chain.Extent{{e(0, 3)}, {e(10, 1), e(20, 2)}, {e(22, 2)}}},
		{16, [][]chain.Extent{{e(0, 1)}, {e(1, 1)}, {e(2, 1)}, {e(10, 1)}, {e(20, 1)}, {e(21, 1)}, {e(22, 1)}, {e(23, 1)}}},
	}
	for _, tt := range tests {
		if got := splitPages(exts, p, tt.n); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("split in %d: %v, want %v", tt.n, got, tt.want)
		}
	}
	if got := splitPages(nil, p, 4); len(got) != 0 {
		t.Errorf("split of nothing: %v", got)
	}
}
