package server

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// TestWriteFilesTree: directories (empty ones too) get their exact
// permission bits whatever the umask, links their targets, files their
// content; a second write of the same tree changes nothing.
func TestWriteFilesTree(t *testing.T) {
	root := filepath.Join(t.TempDir(), "binds/0")
	files := []*api.File{
		{Path: root, Mode: unix.S_IFDIR | 0o777},
		{Path: root + "/..2026_12_01", Mode: unix.S_IFDIR | 0o755},
		{Path: root + "/..2026_12_01/key", Data: []byte("value"), Mode: 0o644},
		{Path: root + "/..data", Data: []byte("..2026_12_01"), Mode: unix.S_IFLNK | 0o777},
		{Path: root + "/key", Data: []byte("..data/key"), Mode: unix.S_IFLNK | 0o777},
		{Path: root + "/empty/a/b", Mode: unix.S_IFDIR | 0o700},
		{Path: root + "/empty/c", Mode: unix.S_IFDIR},
	}
	if _, err := checkFiles(files); err != nil {
		t.Fatal(err)
	}
	old := unix.Umask(0o077)
	t.Cleanup(func() { unix.Umask(old) })
	for round := range 2 {
		if err := writeFiles(files); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for _, tc := range []struct {
			path string
			mode fs.FileMode
		}{
			{root, fs.ModeDir | 0o777},
			{root + "/empty/a/b", fs.ModeDir | 0o700},
			{root + "/empty/c", fs.ModeDir | 0o755},
			{root + "/..data", fs.ModeSymlink | 0o777},
		} {
			if fi, err := os.Lstat(tc.path); err != nil || fi.Mode() != tc.mode {
				t.Errorf("round %d: %s: %v, %v, want mode %v", round, tc.path, fi.Mode(), err, tc.mode)
			}
		}
		if b, err := os.ReadFile(root + "/key"); err != nil || string(b) != "value" {
			t.Errorf("round %d: key through ..data: %q, %v", round, b, err)
		}
	}
}

// TestWriteFilesRefusals: a directory where a file is, and a file where a
// directory is, fail naming the path.
func TestWriteFilesRefusals(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []*api.File{
		{Path: file, Mode: unix.S_IFDIR | 0o755},
		{Path: filepath.Join(dir, "sub"), Mode: unix.S_IFLNK, Data: []byte("x")},
	} {
		if err := writeFiles([]*api.File{f}); err == nil || !strings.Contains(err.Error(), f.Path) {
			t.Errorf("write %s (mode %#o) over what is there: %v, want an error naming it", f.Path, f.Mode, err)
		}
	}
}
