package chain

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFlattenRejectsCorruption(t *testing.T) {
	template := t.TempDir()
	buildChain(t, template, 64)
	mem := int64(64 * testPage)
	tests := []struct {
		name    string
		corrupt func(t *testing.T, dirs []string)
		want    string
	}{
		{"unknown version", setField(0, "version", 2), "unknown link format version 2"},
		{"unknown kind", setField(0, "kind", "delta"), `unknown link kind "delta"`},
		{"unknown field", setField(0, "colour", "blue"), `unknown field "colour"`},
		{"extent out of bounds", rawExtents(0, Extent{mem, testPage}), "out of bounds"},
		{"extent past the end", rawExtents(0, Extent{mem - testPage, 2 * testPage}), "out of bounds"},
		{"extents overlapping", rawExtents(0, Extent{0, 2 * testPage}, Extent{testPage, testPage}), "overlaps"},
		{"extents unsorted", rawExtents(0, Extent{4 * testPage, testPage}, Extent{0, testPage}), "must be sorted"},
		{"extents adjacent", rawExtents(0, Extent{0, testPage}, Extent{testPage, testPage}), "must be merged"},
		{"extent offset not page-aligned", rawExtents(0, Extent{100, testPage}), "not aligned"},
		{"extent length not page-aligned", rawExtents(0, Extent{0, 100}), "not aligned"},
		{"extents truncated", appendFile(0, ExtentsFile, []byte{1, 2, 3}), "truncated"},
		{"extents bad magic", writeFile(0, ExtentsFile, make([]byte, 32)), "bad magic"},
		{"data shorter than extents", truncateData(1, -testPage), "the extents cover"},
		{"data longer than extents", truncateData(1, testPage), "the extents cover"},
		{"parent digest mismatch", setField(0, "vcpus", 4), "parent digest mismatch"},
		{"memory size changes", setField(1, "memoryBytes", 2*mem), "memory size changes"},
		{"chain starts with a diff", swap, "needs its parent"},
		{"full link not first", repeatFirst, "full link"},
		{"missing state file", removeFile(2, "qemu.state"), "qemu.state"},
		{"missing data file", removeFile(1, DataFile), DataFile},
		{"data digest mismatch", flipDataByte(2), "digest mismatch"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			dirs := copyChain(t, template, root)
			tt.corrupt(t, dirs)
			outDir := filepath.Join(root, "flat")
			if err := os.Mkdir(outDir, 0o755); err != nil {
				t.Fatal(err)
			}
			err := Flatten(context.Background(), dirs, filepath.Join(outDir, "memory"))
			if err == nil {
				t.Fatal("flatten of a corrupt chain succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q does not mention %q", err, tt.want)
			}
			assertEmptyDir(t, outDir)
		})
	}
}

func TestValidateDiffNeedsParent(t *testing.T) {
	root := t.TempDir()
	c := buildChain(t, root, 16)
	if _, err := Validate(c.dirs[1], nil); err == nil || !strings.Contains(err.Error(), "needs its parent") {
		t.Fatalf("validate diff without parent: %v", err)
	}
	parent, err := Validate(c.dirs[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := Validate(c.dirs[1], parent)
	if err != nil {
		t.Fatal(err)
	}
	if l.Parent != parent.ID() {
		t.Fatalf("diff parent %s, want %s", l.Parent, parent.ID())
	}
}

func TestReadLinkRejectsBadStateNames(t *testing.T) {
	for _, name := range []string{"../x", "memory.data", ".tmp-x", ""} {
		root := t.TempDir()
		c := buildChain(t, root, 16)
		setField(0, "stateFiles", []string{name})(t, c.dirs)
		if _, err := ReadLink(c.dirs[0]); err == nil {
			t.Errorf("state file %q accepted", name)
		}
	}
}

func copyChain(t *testing.T, template, root string) []string {
	t.Helper()
	var dirs []string
	for i := 0; i < 3; i++ {
		src := filepath.Join(template, "link"+string(rune('0'+i)))
		dst := filepath.Join(root, filepath.Base(src))
		if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, dst)
	}
	return dirs
}

func setField(link int, key string, value any) func(*testing.T, []string) {
	return func(t *testing.T, dirs []string) {
		path := filepath.Join(dirs[link], LinkFile)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]any{}
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		m[key] = value
		if b, err = json.Marshal(m); err != nil {
			t.Fatal(err)
		}
		writeFile(link, LinkFile, b)(t, dirs)
	}
}

func rawExtents(link int, exts ...Extent) func(*testing.T, []string) {
	b := []byte(extentsMagic + "\x01\x00\x00\x00\x00\x00\x00\x00")
	for _, e := range exts {
		b = binary.LittleEndian.AppendUint64(b, uint64(e.Offset))
		b = binary.LittleEndian.AppendUint64(b, uint64(e.Length))
	}
	return writeFile(link, ExtentsFile, b)
}

func writeFile(link int, name string, b []byte) func(*testing.T, []string) {
	return func(t *testing.T, dirs []string) {
		path := filepath.Join(dirs[link], name)
		os.Chmod(path, 0o644)
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func appendFile(link int, name string, b []byte) func(*testing.T, []string) {
	return func(t *testing.T, dirs []string) {
		f, err := os.OpenFile(filepath.Join(dirs[link], name), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.Write(b); err != nil {
			t.Fatal(err)
		}
	}
}

func truncateData(link int, delta int64) func(*testing.T, []string) {
	return func(t *testing.T, dirs []string) {
		path := filepath.Join(dirs[link], DataFile)
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(path, fi.Size()+delta); err != nil {
			t.Fatal(err)
		}
	}
}

func removeFile(link int, name string) func(*testing.T, []string) {
	return func(t *testing.T, dirs []string) {
		if err := os.Remove(filepath.Join(dirs[link], name)); err != nil {
			t.Fatal(err)
		}
	}
}

func flipDataByte(link int) func(*testing.T, []string) {
	return func(t *testing.T, dirs []string) {
		f, err := os.OpenFile(filepath.Join(dirs[link], DataFile), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		b := make([]byte, 1)
		if _, err := f.ReadAt(b, 10); err != nil {
			t.Fatal(err)
		}
		b[0] ^= 0xff
		if _, err := f.WriteAt(b, 10); err != nil {
			t.Fatal(err)
		}
	}
}

func swap(t *testing.T, dirs []string) {
	dirs[0], dirs[1] = dirs[1], dirs[0]
}

func repeatFirst(t *testing.T, dirs []string) {
	dirs[1] = dirs[0]
}
