package server

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

func link(path, target string) *api.File {
	return &api.File{Path: path, Data: []byte(target), Mode: unix.S_IFLNK | 0o777}
}

// TestUpdateFilesSwapsData replays kubelet's atomic update of a volume: a
// new timestamped dir, ..data swapped to it, a new key's link, the old
// key's link and dir removed.
func TestUpdateFilesSwapsData(t *testing.T) {
	state := t.TempDir()
	s := New(&fakeSystem{j: &journal{}}, WithStateDir(state))
	vol := filepath.Join(state, bindCopies, "0")
	ctx := context.Background()
	first := &api.UpdateFilesRequest{Files: []*api.File{
		{Path: vol + "/..t1", Mode: unix.S_IFDIR | 0o755},
		{Path: vol + "/..t1/old", Data: []byte("1")},
		link(vol+"/..data", "..t1"),
		link(vol+"/old", "..data/old"),
	}}
	second := &api.UpdateFilesRequest{Files: []*api.File{
		{Path: vol + "/..t2", Mode: unix.S_IFDIR | 0o755},
		{Path: vol + "/..t2/new", Data: []byte("2")},
		link(vol+"/..data", "..t2"),
		link(vol+"/new", "..data/new"),
	}, Remove: []string{vol + "/old", vol + "/..t1"}}
	for _, req := range []*api.UpdateFilesRequest{first, second} {
		if _, err := s.UpdateFiles(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if b, err := os.ReadFile(vol + "/new"); err != nil || string(b) != "2" {
		t.Fatalf("new key: %q, %v", b, err)
	}
	entries, _ := os.ReadDir(vol)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) != 3 { // ..data, ..t2, new
		t.Fatalf("the volume holds %v, want ..data, ..t2 and new", names)
	}
}

func TestUpdateFilesRefusals(t *testing.T) {
	state := t.TempDir()
	s := New(&fakeSystem{j: &journal{}}, WithStateDir(state))
	root := filepath.Join(state, bindCopies)
	outside := t.TempDir()
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "escape")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		req  *api.UpdateFilesRequest
	}{
		{"outside", &api.UpdateFilesRequest{Files: []*api.File{{Path: "/etc/x", Data: []byte("x")}}}},
		{"the root", &api.UpdateFilesRequest{Remove: []string{root}}},
		{"dot dot", &api.UpdateFilesRequest{Remove: []string{root + "/../x"}}},
		{"under a link", &api.UpdateFilesRequest{Files: []*api.File{{Path: root + "/escape/x", Data: []byte("x")}}}},
		{"remove under a link", &api.UpdateFilesRequest{Remove: []string{root + "/escape/y"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := s.UpdateFiles(context.Background(), tc.req); !errdefs.IsInvalidArgument(err) {
				t.Fatalf("got %v, want InvalidArgument", err)
			}
		})
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Fatalf("a refused update wrote outside: %v", entries)
	}
}

// TestUpdateFilesPieces: a file sent in pieces over several requests is
// nowhere to be seen under its name until its last piece, then whole, with
// its mode; a piece out of order is refused and drops what was gathered.
func TestUpdateFilesPieces(t *testing.T) {
	state := t.TempDir()
	s := New(&fakeSystem{j: &journal{}}, WithStateDir(state))
	p := filepath.Join(state, bindCopies, "0", "big")
	ctx := context.Background()
	piece := func(off uint64, data string, more bool) *api.UpdateFilesRequest {
		return &api.UpdateFilesRequest{Files: []*api.File{{Path: p, Data: []byte(data), Mode: 0o600, Offset: off, More: more}}}
	}
	for _, req := range []*api.UpdateFilesRequest{piece(0, "ab", true), piece(2, "cd", true)} {
		if _, err := s.UpdateFiles(ctx, req); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Fatalf("a file in pieces is there before its last piece: %v", err)
		}
	}
	if _, err := s.UpdateFiles(ctx, piece(4, "e", false)); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(p); err != nil || string(b) != "abcde" {
		t.Fatalf("file: %q, %v, want abcde", b, err)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode: %v, %v, want 0600", fi.Mode(), err)
	}

	for _, req := range []*api.UpdateFilesRequest{piece(0, "ab", true), piece(3, "x", false)} {
		_, err := s.UpdateFiles(ctx, req)
		if req.Files[0].Offset == 3 && !errdefs.IsInvalidArgument(err) {
			t.Fatalf("a piece out of order: %v, want InvalidArgument", err)
		}
	}
	if b, err := os.ReadFile(p); err != nil || string(b) != "abcde" {
		t.Fatalf("after a refused piece the file is %q, %v, want the old abcde", b, err)
	}
	if entries, _ := os.ReadDir(filepath.Dir(p)); len(entries) != 1 {
		t.Fatalf("a refused piece left %v beside the file", entries)
	}
}
