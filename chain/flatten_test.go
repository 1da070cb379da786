package chain

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
)

func TestFlattenChain(t *testing.T) {
	root := t.TempDir()
	c := buildChain(t, root, 1024)
	for n := 1; n <= len(c.dirs); n++ {
		out := filepath.Join(root, "flat", "memory")
		os.MkdirAll(filepath.Dir(out), 0o755)
		if err := Flatten(context.Background(), c.dirs[:n], out); err != nil {
			t.Fatalf("flatten %d links: %v", n, err)
		}
		got, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, c.mems[n-1]) {
			t.Fatalf("flatten of %d links differs from the memory it was made from", n)
		}
		checkSparse(t, out, c.mems[n-1])
		fi, err := os.Stat(out)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o444 {
			t.Errorf("flat file mode %v, want 0444", fi.Mode().Perm())
		}
		if err := os.Remove(out); err != nil {
			t.Fatal(err)
		}
		assertEmptyDir(t, filepath.Dir(out))
	}
}

func TestFlattenFullLinkSkipsZeroPages(t *testing.T) {
	root := t.TempDir()
	c := buildChain(t, root, 256)
	l, err := ReadLink(c.dirs[0])
	if err != nil {
		t.Fatal(err)
	}
	var nonZero int64
	for off := 0; off < len(c.mems[0]); off += testPage {
		if !isZero(c.mems[0][off : off+testPage]) {
			nonZero += testPage
		}
	}
	if l.Memory.DataBytes != nonZero {
		t.Fatalf("full link carries %d bytes, memory has %d non-zero", l.Memory.DataBytes, nonZero)
	}
}

func TestFlattenRejectsCancelledContext(t *testing.T) {
	root := t.TempDir()
	c := buildChain(t, root, 64)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	out := filepath.Join(root, "flat")
	os.Mkdir(out, 0o755)
	if err := Flatten(ctx, c.dirs, filepath.Join(out, "memory")); err == nil {
		t.Fatal("flatten with a cancelled context succeeded")
	}
	assertEmptyDir(t, out)
}

func TestIsTemp(t *testing.T) {
	for name, want := range map[string]bool{
		".tmp-memory-123":       true,
		"/a/b/.tmp-chain.json-": true,
		"memory":                false,
		"a/.tmp-/memory":        false,
	} {
		if got := IsTemp(name); got != want {
			t.Errorf("IsTemp(%q) = %v, want %v", name, got, want)
		}
	}
}

// assertEmptyDir fails if dir holds anything (no output, no temp files).
func assertEmptyDir(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		t.Errorf("%s: unexpected %s left behind", dir, e.Name())
	}
}
