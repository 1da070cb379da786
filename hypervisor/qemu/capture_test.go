package qemu

import (
	"bytes"
	"strings"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

func TestCapturedPages(t *testing.T) {
	const page = 4096
	mem := numberedPages(8, page)
	// Unsorted, as a copy restore's changed pages come: data, then holes.
	exts := []chain.Extent{{Offset: 5 * page, Length: page}, {Offset: page, Length: 2 * page}, {Offset: 3 * page, Length: page}}
	buf := &pageBuffer{}
	t.Cleanup(buf.release)
	c, ok, err := capturePages(bytes.NewReader(mem), exts, buf)
	if err != nil || !ok {
		t.Fatalf("capture: %v, %v", ok, err)
	}
	for i := range mem {
		mem[i] = 0xff // the guest runs on
	}
	tests := []struct {
		name    string
		off     int64
		n       int
		want    []byte
		wantErr string
	}{
		{name: "one page", off: 5 * page, n: page, want: bytes.Repeat([]byte{5}, page)},
		{name: "inside an extent", off: page + 10, n: 20, want: bytes.Repeat([]byte{1}, 20)},
		{name: "across adjacent extents", off: 2 * page, n: 2 * page, want: append(bytes.Repeat([]byte{2}, page), bytes.Repeat([]byte{3}, page)...)},
		{name: "a page not captured", off: 4 * page, n: page, wantErr: "not captured"},
		{name: "running into a page not captured", off: 3 * page, n: 2 * page, wantErr: "not captured"},
		{name: "past the last extent", off: 7 * page, n: 1, wantErr: "not captured"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := make([]byte, tt.n)
			_, err := c.ReadAt(got, tt.off)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tt.want) {
				t.Fatalf("read %d bytes at %d: got %v…, want %v…", tt.n, tt.off, got[:4], tt.want[:4])
			}
		})
	}
}

func TestCapturePagesBounded(t *testing.T) {
	_, ok, err := capturePages(bytes.NewReader(nil), []chain.Extent{{Offset: 0, Length: maxCaptured + 4096}}, &pageBuffer{})
	if err != nil || ok {
		t.Fatalf("capture of more than maxCaptured: ok %v err %v, want it declined", ok, err)
	}
}

func TestPageBufferTake(t *testing.T) {
	small, err := hugeBuffer(4096)
	if err != nil {
		t.Fatal(err)
	}
	buf := &pageBuffer{b: small}
	t.Cleanup(buf.release)
	for _, n := range []int64{4096, 2048, 3 * 4096, 4096} {
		b, err := buf.take(n)
		if err != nil {
			t.Fatalf("take %d: %v", n, err)
		}
		if int64(len(b)) != n {
			t.Fatalf("take %d: got %d bytes", n, len(b))
		}
		b[n-1] = 1 // mapped and writable
	}
}
