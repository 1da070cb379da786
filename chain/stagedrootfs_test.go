package chain

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestStagedRootfsRoundTrip(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, StagedRootfsImage), make([]byte, 8192), 0o444); err != nil {
		t.Fatal(err)
	}
	want := StagedRootfs{FSType: RootfsErofs, Size: 8192, Key: "erofs-7", Layers: 3}
	if err := WriteStagedRootfs(dir, want); err != nil {
		t.Fatal(err)
	}
	got, err := OpenStagedRootfs(dir)
	if err != nil {
		t.Fatal(err)
	}
	want.Version, want.Dir = Version, dir
	if *got != want {
		t.Errorf("read back %+v, want %+v", *got, want)
	}
	if got.ImagePath() != filepath.Join(dir, StagedRootfsImage) {
		t.Errorf("image path %s", got.ImagePath())
	}
}

func TestOpenStagedRootfsRejects(t *testing.T) {
	good := `{"version":1,"fstype":"erofs","size":4096,"key":"erofs-1","layers":1}`
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string)
		want  string
	}{
		{"no descriptor", func(t *testing.T, dir string) {}, "no such file"},
		{"unknown version", descriptor(`{"version":9,"fstype":"erofs","size":4096,"key":"k","layers":1}`), "version 9"},
		{"ext2", descriptor(`{"version":1,"fstype":"ext2","size":4096,"key":"k","layers":1}`), `fstype "ext2"`},
		{"no key", descriptor(`{"version":1,"fstype":"erofs","size":4096,"layers":1}`), "no layer chain key"},
		{"no layers", descriptor(`{"version":1,"fstype":"erofs","size":4096,"key":"k"}`), "0 layers"},
		{"not JSON", descriptor(`erofs`), "parse"},
		{"descriptor too big", descriptor(good + strings.Repeat(" ", maxRootfsJSON)), "over"},
		{"descriptor is a FIFO", func(t *testing.T, dir string) {
			if err := syscall.Mkfifo(filepath.Join(dir, StagedRootfsFile), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "want a regular file"},
		{"descriptor is a symlink", func(t *testing.T, dir string) {
			descriptor(good)(t, dir)
			os.Rename(filepath.Join(dir, StagedRootfsFile), filepath.Join(dir, "real.json"))
			if err := os.Symlink("real.json", filepath.Join(dir, StagedRootfsFile)); err != nil {
				t.Fatal(err)
			}
		}, "too many levels of symbolic links"},
		{"no image", descriptor(good), "no such file"},
		{"image of another size", func(t *testing.T, dir string) {
			descriptor(good)(t, dir)
			image(t, dir, 100)
		}, "want a regular file of 4096 bytes"},
		{"image is a symlink", func(t *testing.T, dir string) {
			descriptor(good)(t, dir)
			image(t, dir, 4096)
			os.Rename(filepath.Join(dir, StagedRootfsImage), filepath.Join(dir, "real.img"))
			if err := os.Symlink("real.img", filepath.Join(dir, StagedRootfsImage)); err != nil {
				t.Fatal(err)
			}
		}, "want a regular file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.setup(t, dir)
			_, err := OpenStagedRootfs(dir)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("OpenStagedRootfs = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func descriptor(s string) func(t *testing.T, dir string) {
	return func(t *testing.T, dir string) {
		if err := os.WriteFile(filepath.Join(dir, StagedRootfsFile), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func image(t *testing.T, dir string, size int) {
	if err := os.WriteFile(filepath.Join(dir, StagedRootfsImage), make([]byte, size), 0o444); err != nil {
		t.Fatal(err)
	}
}

func TestStagedRootfsDir(t *testing.T) {
	tests := []struct {
		opts []string
		want string // "" = an error
	}{
		{[]string{"workdir=/r/snapshots/9/work", "upperdir=/r/snapshots/9/fs", "lowerdir=/r/snapshots/3/fs:/r/snapshots/1", "index=off"}, "/r/snapshots/9"},
		{[]string{"upperdir=/r/snapshots/9/fs/"}, "/r/snapshots/9"},
		{[]string{"lowerdir=/a:/b"}, ""},
		{[]string{"upperdir=fs"}, ""},
		{nil, ""},
	}
	for _, tc := range tests {
		got, err := StagedRootfsDir(tc.opts)
		if (err != nil) != (tc.want == "") || got != tc.want {
			t.Errorf("StagedRootfsDir(%q) = %q, %v; want %q", tc.opts, got, err, tc.want)
		}
	}
}

func TestWriteStagedRootfsRejectsBadInput(t *testing.T) {
	if err := WriteStagedRootfs(t.TempDir(), StagedRootfs{FSType: RootfsErofs, Key: "k", Layers: 1}); err == nil {
		t.Error("wrote a descriptor of a 0-byte image")
	}
}
