package chain

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A prefix's flat file plus the top links' pages read with ReadPages is
// the chain's memory, and chain.json says how much the file holds.
func TestStagedDeltas(t *testing.T) {
	ctx := context.Background()
	root, c, links := validChain(t)
	staged := filepath.Join(root, "staged")
	if err := os.Mkdir(staged, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := WriteStagedMemory(staged, links, StagedMemoryInfo{Covers: 1, Reason: "prefix cached"}); err != nil {
		t.Fatal(err)
	}
	st, err := OpenStaged(staged)
	if err != nil {
		t.Fatal(err)
	}
	if st.Memory.Covers != 1 || st.Memory.Reason != "prefix cached" || len(st.Pending()) != 2 {
		t.Fatalf("staged memory %+v with %d pending links, want covers 1 and 2 pending", st.Memory, len(st.Pending()))
	}
	mem := bytes.Clone(c.mems[0])
	for i, l := range st.Pending() {
		dir := c.dirs[st.Memory.Covers+i]
		err := ReadPages(ctx, filepath.Join(dir, ExtentsFile), filepath.Join(dir, DataFile), l, func(off int64, b []byte) error {
			copy(mem[off:], b)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(mem, c.mems[2]) {
		t.Fatal("prefix memory + pending links' pages is not the chain's memory")
	}

	all := filepath.Join(root, "all")
	if err := os.Mkdir(all, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := WriteStaged(all, links); err != nil {
		t.Fatal(err)
	}
	if st, err := OpenStaged(all); err != nil || st.Memory.Covers != 3 || len(st.Pending()) != 0 {
		t.Fatalf("fully staged chain: %+v, %v; want covers 3, nothing pending", st, err)
	}
	if err := WriteStagedMemory(all, links, StagedMemoryInfo{Covers: 4}); err == nil || !strings.Contains(err.Error(), "covers 4 links of a chain of 3") {
		t.Errorf("covers past the chain: %v", err)
	}
}

func TestReadPagesRejects(t *testing.T) {
	ctx := context.Background()
	root, c, links := validChain(t)
	dir, l := c.dirs[1], links[1]
	data, err := os.ReadFile(filepath.Join(dir, DataFile))
	if err != nil {
		t.Fatal(err)
	}
	corrupt := filepath.Join(root, "corrupt")
	bad := bytes.Clone(data)
	bad[len(bad)/2] ^= 1
	short := filepath.Join(root, "short")
	long := filepath.Join(root, "long")
	for path, b := range map[string][]byte{corrupt: bad, short: data[:len(data)-testPage], long: append(bytes.Clone(data), 0)} {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct{ data, want string }{
		{corrupt, "digest mismatch"}, {short, "shorter than its extents"}, {long, "longer than its extents"},
	} {
		err := ReadPages(ctx, filepath.Join(dir, ExtentsFile), tt.data, l, func(int64, []byte) error { return nil })
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q", filepath.Base(tt.data), err, tt.want)
		}
	}
	// The other link's extents are not this link's.
	if err := ReadPages(ctx, filepath.Join(c.dirs[2], ExtentsFile), filepath.Join(dir, DataFile), l, func(int64, []byte) error { return nil }); err == nil {
		t.Error("pages read with another link's extents")
	}
	m := testMeta("memory.delta1.data")
	writeState(t, filepath.Join(root, "reserved"), "memory.delta1.data")
	if _, err := WriteFull(ctx, filepath.Join(root, "mem0"), m, filepath.Join(root, "reserved")); err == nil || !strings.Contains(err.Error(), "reserved name") {
		t.Errorf("a state file named like a staged delta: %v, want a reserved-name error", err)
	}
}

// ApplyPending hands over the pending links' staged pages, oldest first,
// and still refuses a data file whose size does not match its extents, or
// extents that are not the link's.
func TestApplyPending(t *testing.T) {
	ctx := context.Background()
	_, c, links := validChain(t)
	data, err := os.ReadFile(filepath.Join(c.dirs[1], DataFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		// stage puts link i's files at ext and dat.
		stage func(i int, ext, dat string) error
		want  string
	}{
		{"staged", stageDeltaLink(c.dirs, nil, nil), ""},
		{"short", stageDeltaLink(c.dirs, data[:len(data)-testPage], nil), "shorter than its extents"},
		{"long", stageDeltaLink(c.dirs, append(bytes.Clone(data), 0), nil), "longer than its extents"},
		{"other extents", stageDeltaLink(c.dirs, nil, []int{1: 2, 2: 1}), "digest"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := WriteStagedMemory(dir, links, StagedMemoryInfo{Covers: 1}); err != nil {
				t.Fatal(err)
			}
			st, err := OpenStaged(dir)
			if err != nil {
				t.Fatal(err)
			}
			for i := range st.Pending() {
				ext, dat := st.DeltaPaths(st.Memory.Covers + i)
				if err := tt.stage(st.Memory.Covers+i, ext, dat); err != nil {
					t.Fatal(err)
				}
			}
			mem := bytes.Clone(c.mems[0])
			err = st.ApplyPending(ctx, func(off int64, b []byte) error {
				copy(mem[off:], b)
				return nil
			})
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(mem, c.mems[2]) {
					t.Fatal("prefix memory + applied pending links is not the chain's memory")
				}
				return
			}
			if err == nil || !strings.HasPrefix(err.Error(), "link ") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("ApplyPending: %v, want an error naming the link and %q", err, tt.want)
			}
		})
	}
}

// stageDeltaLink stages link i's memory files by hard link from dirs, with
// link 1's data replaced by data1 (if set) and the extents of link
// extentsOf[i] (if set) instead of its own.
func stageDeltaLink(dirs []string, data1 []byte, extentsOf []int) func(i int, ext, dat string) error {
	return func(i int, ext, dat string) error {
		from := i
		if extentsOf != nil {
			from = extentsOf[i]
		}
		if err := os.Link(filepath.Join(dirs[from], ExtentsFile), ext); err != nil {
			return err
		}
		if i == 1 && data1 != nil {
			return os.WriteFile(dat, data1, 0o444)
		}
		return os.Link(filepath.Join(dirs[i], DataFile), dat)
	}
}

// validChain builds a 64-page test chain under a temp root and validates it.
func validChain(t *testing.T) (string, testChain, []*Link) {
	t.Helper()
	root := t.TempDir()
	c := buildChain(t, root, 64)
	links, err := ValidateChain(c.dirs)
	if err != nil {
		t.Fatal(err)
	}
	return root, c, links
}
