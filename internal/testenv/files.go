package testenv

import (
	"bytes"
	"errors"
	"io"
	"os"
	"testing"
)

// DifferingPages counts the 4 KiB pages in which files a and b differ,
// failing t if either cannot be read or their sizes differ.
func DifferingPages(t testing.TB, a, b string) int64 {
	t.Helper()
	fa, err := os.Open(a)
	if err != nil {
		t.Fatal(err)
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	const page = 4096
	pa, pb := make([]byte, page), make([]byte, page)
	var n int64
	for off := int64(0); ; off += page {
		_, ea := fa.ReadAt(pa, off)
		_, eb := fb.ReadAt(pb, off)
		if errors.Is(ea, io.EOF) && errors.Is(eb, io.EOF) {
			return n
		}
		if ea != nil || eb != nil {
			t.Fatalf("compare %s and %s at %d: %v, %v", a, b, off, ea, eb)
		}
		if !bytes.Equal(pa, pb) {
			n++
		}
	}
}
