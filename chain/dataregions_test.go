package chain

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestDataRegions(t *testing.T) {
	const blk = 64 << 10 // several file system blocks, so holes are real
	tests := []struct {
		name   string
		blocks int64      // file size in blocks
		data   [][2]int64 // [start, end) blocks written with data
		want   []Extent   // in blocks
	}{
		{name: "empty file"},
		{name: "all hole", blocks: 4},
		{name: "all data", blocks: 4, data: [][2]int64{{0, 4}}, want: []Extent{{0, 4}}},
		{name: "hole at start", blocks: 4, data: [][2]int64{{2, 4}}, want: []Extent{{2, 2}}},
		{name: "hole in middle", blocks: 4, data: [][2]int64{{0, 1}, {3, 4}}, want: []Extent{{0, 1}, {3, 1}}},
		{name: "hole at end", blocks: 4, data: [][2]int64{{0, 2}}, want: []Extent{{0, 2}}},
		{name: "holes everywhere", blocks: 7, data: [][2]int64{{1, 2}, {3, 5}}, want: []Extent{{1, 1}, {3, 2}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := sparseFile(t, tt.blocks*blk, tt.data, blk)
			var got []Extent
			for e, err := range DataRegions(f) {
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, Extent{e.Offset / blk, e.Length / blk})
				if e.Offset%blk != 0 || e.Length%blk != 0 {
					t.Fatalf("extent %+v is not whole %d-byte blocks", e, blk)
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("extents %v (blocks), want %v", got, tt.want)
			}
		})
	}
}

func TestDataRegionsStopsEarly(t *testing.T) {
	const blk = 64 << 10
	f := sparseFile(t, 4*blk, [][2]int64{{0, 1}, {2, 3}}, blk)
	n := 0
	for range DataRegions(f) {
		n++
		break
	}
	if n != 1 {
		t.Fatalf("loop ran %d times after break, want 1", n)
	}
}

func TestDataRegionsClosedFile(t *testing.T) {
	f := sparseFile(t, 1<<20, [][2]int64{{0, 1}}, 64<<10)
	f.Close()
	n := 0
	for _, err := range DataRegions(f) {
		n++
		if err == nil {
			t.Fatal("closed file yielded an extent, want an error")
		}
	}
	if n != 1 {
		t.Fatalf("got %d results, want one error", n)
	}
}

// sparseFile creates a size-byte file with non-zero bytes in each [start,
// end) of data (in units of blk) and holes elsewhere, opened for reading.
func sparseFile(t *testing.T, size int64, data [][2]int64, blk int64) *os.File {
	t.Helper()
	path := filepath.Join(t.TempDir(), "memory")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
	w, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, d := range data {
		b := bytes.Repeat([]byte{0xa5}, int((d[1]-d[0])*blk))
		if _, err := w.WriteAt(b, d[0]*blk); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}
