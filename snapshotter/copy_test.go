package snapshotter

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestCloneFileKeepsHoles(t *testing.T) {
	data := bytes.Repeat([]byte{0xab}, 2*page)
	tests := []struct {
		name   string
		size   int64
		writes []int64 // offsets of 2-page data runs
	}{
		{"empty", 0, nil},
		{"all hole", 8 * page, nil},
		{"data only", 2 * page, []int64{0}},
		{"hole then data at the end", 8 * page, []int64{6 * page}},
		{"data, hole, data, trailing hole", 16 * page, []int64{0, 7 * page}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
			f, err := os.Create(src)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.Truncate(tc.size); err != nil {
				t.Fatal(err)
			}
			for _, off := range tc.writes {
				if _, err := f.WriteAt(data, off); err != nil {
					t.Fatal(err)
				}
			}
			f.Close()

			if _, err := cloneFile(src, dst); err != nil {
				t.Fatalf("clone: %v", err)
			}
			sameContent(t, src, dst)
			s, d := stat(t, src), stat(t, dst)
			if d.Size != s.Size || d.Blocks != s.Blocks {
				t.Errorf("copy has size %d, %d blocks; source %d, %d blocks", d.Size, d.Blocks, s.Size, s.Blocks)
			}
			if d.Mode&0o777 != 0o444 {
				t.Errorf("copy mode %o, want 0444", d.Mode&0o777)
			}
		})
	}
}

func TestCloneFileRefusesExistingTarget(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	for _, p := range []string{src, dst} {
		if err := os.WriteFile(p, []byte(p), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cloneFile(src, dst); err == nil {
		t.Fatal("clone over an existing file succeeded, want an error")
	}
	if got, _ := os.ReadFile(dst); string(got) != dst {
		t.Errorf("the existing target was changed or removed: %q", got)
	}
}
