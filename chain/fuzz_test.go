package chain

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzParseLink: arbitrary link.json bytes never panic, and whatever parses
// passes the field checks.
func FuzzParseLink(f *testing.F) {
	root := f.TempDir()
	c := buildChain(f, root, 8)
	for _, dir := range c.dirs {
		b, err := os.ReadFile(filepath.Join(dir, LinkFile))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"version":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := ParseLink(b)
		if err != nil {
			return
		}
		if err := l.check(); err != nil {
			t.Fatalf("parsed link fails its checks: %v", err)
		}
	})
}

// FuzzExtents: arbitrary memory.extents bytes never panic, and accepted
// extents are sorted, disjoint, aligned and in bounds, and every byte is
// a record.
func FuzzExtents(f *testing.F) {
	f.Add([]byte(extentsMagic + "\x01\x00\x00\x00\x00\x00\x00\x00" + "\x00\x10\x00\x00\x00\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00"))
	f.Add([]byte(extentsMagic))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(dir, ExtentsFile)
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		const mem = 1 << 20
		c := extentChecker{memBytes: mem, pageSize: testPage}
		var end int64
		n, _, err := readExtents(path, maxExtentsSize(mem, testPage), func(e Extent) error {
			if err := c.check(e); err != nil {
				return err
			}
			if e.Offset <= end && end > 0 || e.End() > mem || e.Offset%testPage != 0 {
				t.Fatalf("accepted bad extent %+v after end %d", e, end)
			}
			end = e.End()
			return nil
		})
		if err == nil && int64(len(b)) != extentsHeaderSize+n*extentRecordSize {
			t.Fatalf("accepted %d bytes as %d records", len(b), n)
		}
	})
}
