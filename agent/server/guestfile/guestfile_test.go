package guestfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
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
	if _, err := Check(files); err != nil {
		t.Fatal(err)
	}
	old := unix.Umask(0o077)
	t.Cleanup(func() { unix.Umask(old) })
	for round := range 2 {
		if err := Write(files); err != nil {
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
		if err := Write([]*api.File{f}); err == nil || !strings.Contains(err.Error(), f.Path) {
			t.Errorf("write %s (mode %#o) over what is there: %v, want an error naming it", f.Path, f.Mode, err)
		}
	}
}

// FuzzWriteFiles: whatever tree of files, directories and links Init asks
// for under a root, once checkFiles accepts it, writeFiles changes nothing
// outside that root (a link it makes is never written through).
func FuzzWriteFiles(f *testing.F) {
	f.Add("d a\nl a/b ../../outside\nf a/b/c x")
	f.Add("l a ../outside\nf a/x secret\nd a/y")
	f.Add("l a /\nl a/etc x\nd b\nl b/c ../../outside/canary\nf b/c over")
	f.Add("d ..data\nl key ..data/key\nf ..data/key v")
	f.Fuzz(func(t *testing.T, spec string) {
		base := t.TempDir()
		root, canary := filepath.Join(base, "root"), filepath.Join(base, "outside", "canary")
		if err := os.MkdirAll(filepath.Dir(canary), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(canary, []byte("canary"), 0o644); err != nil {
			t.Fatal(err)
		}
		var files []*api.File
		for _, line := range strings.Split(spec, "\n") {
			kind, rest, _ := strings.Cut(line, " ")
			name, data, _ := strings.Cut(rest, " ")
			file := &api.File{Path: filepath.Join(root, name), Data: []byte(data)}
			switch kind {
			case "d":
				file.Mode, file.Data = unix.S_IFDIR|0o755, nil
			case "l":
				file.Mode = unix.S_IFLNK | 0o777
			}
			if !strings.HasPrefix(file.Path, root+"/") {
				return
			}
			files = append(files, file)
		}
		if _, err := Check(files); err != nil {
			return
		}
		_ = Write(files)
		entries, err := os.ReadDir(filepath.Dir(canary))
		if b, rerr := os.ReadFile(canary); err != nil || len(entries) != 1 || rerr != nil || string(b) != "canary" {
			t.Fatalf("writing %q changed what is outside its root: %v entries, canary %q", spec, entries, b)
		}
		if entries, _ := os.ReadDir(base); len(entries) > 2 {
			t.Fatalf("writing %q made %v beside its root", spec, entries)
		}
	})
}

// TestWriteTmpfs: a directory with a tmpfs size is a tmpfs of that size,
// made once however often it is written, that a write past the size fails
// on, and that Remove unmounts and removes.
func TestWriteTmpfs(t *testing.T) {
	testenv.RequireRoot(t)
	dir := filepath.Join(t.TempDir(), "empty-dir")
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	files := []*api.File{{Path: dir, Mode: unix.S_IFDIR | 0o777, TmpfsSize: 64 << 10}, {Path: dir + "/x", Data: []byte("hi")}}
	for range 2 {
		if err := Write(files); err != nil {
			t.Fatal(err)
		}
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Type != unix.TMPFS_MAGIC || st.Blocks*uint64(st.Bsize) != 64<<10 {
		t.Fatalf("statfs %s: type %#x, %d blocks of %d, %v: want a tmpfs of 64 KiB", dir, st.Type, st.Blocks, st.Bsize, err)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if n := strings.Count(string(mounts), " "+dir+" "); n != 1 {
		t.Fatalf("%s is mounted %d times, want once", dir, n)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o777 {
		t.Fatalf("the tmpfs's mode: %v, %v, want 0777", fi.Mode(), err)
	}
	if err := os.WriteFile(dir+"/big", make([]byte, 128<<10), 0o644); !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("writing past the size: %v, want ENOSPC", err)
	}
	if err := Remove(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		t.Fatalf("after Remove: %v, want it gone", err)
	}
}

func TestCheckTmpfsOnAFile(t *testing.T) {
	_, err := Check([]*api.File{{Path: "/run/x", Data: []byte("x"), TmpfsSize: 1 << 20}})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "expected a directory's mode") {
		t.Fatalf("a tmpfs size on a file: %v, want invalid argument", err)
	}
}
