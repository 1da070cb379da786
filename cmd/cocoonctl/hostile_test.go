package main

import (
	"archive/tar"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// copyLinkDir copies the regular files of link dir src into a new dir.
func copyLinkDir(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// replaceWithFIFO makes path a named pipe nobody writes.
func replaceWithFIFO(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestHostileLinkFiles runs inspect and pack as commands on links whose
// files are not what a layer may hold: a FIFO must not block them (nor
// hang them past a signal), a symlink must not pull a host file in.
func TestHostileLinkFiles(t *testing.T) {
	root := t.TempDir()
	dirs, _ := makeTestChain(t, root)
	secret := filepath.Join(root, "host-secret")
	if err := os.WriteFile(secret, []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(root, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    func(link string) []string
		mutate  func(t *testing.T, link string)
		wantErr string
	}{
		{"inspect: link.json is a FIFO", inspectArgs, func(t *testing.T, l string) {
			replaceWithFIFO(t, filepath.Join(l, chain.LinkFile))
		}, "FIFO, want a regular file"},
		{"inspect: memory.extents is a FIFO", inspectArgs, func(t *testing.T, l string) {
			replaceWithFIFO(t, filepath.Join(l, chain.ExtentsFile))
		}, "FIFO, want a regular file"},
		{"inspect: memory.data is a FIFO", inspectArgs, func(t *testing.T, l string) {
			replaceWithFIFO(t, filepath.Join(l, chain.DataFile))
		}, "FIFO, want a regular file"},
		{"inspect: the archive is a FIFO", func(string) []string { return []string{"inspect", fifo} }, func(*testing.T, string) {},
			"FIFO, want a regular file"},
		{"inspect: a state file is a FIFO", inspectArgs, func(t *testing.T, l string) {
			replaceWithFIFO(t, filepath.Join(l, "qemu.state"))
		}, "FIFO, want a regular file"},
		{"pack: a state file is a symlink to a host file", packArgs, func(t *testing.T, l string) {
			symlink(t, secret, filepath.Join(l, "qemu.state"))
		}, "a symbolic link, want a regular file"},
		{"pack: memory.data is a symlink", packArgs, func(t *testing.T, l string) {
			symlink(t, filepath.Join(dirs[0], chain.DataFile), filepath.Join(l, chain.DataFile))
		}, "a symbolic link, want a regular file"},
		{"pack: link.json is a symlink", packArgs, func(t *testing.T, l string) {
			symlink(t, filepath.Join(dirs[0], chain.LinkFile), filepath.Join(l, chain.LinkFile))
		}, "a symbolic link, want a regular file"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			link := filepath.Join(root, "hostile"+string(rune('a'+i)))
			copyLinkDir(t, dirs[0], link)
			tt.mutate(t, link)
			args := tt.args(link)
			c := startCocoonctl(t, nil, args...)
			if code := c.wait(t, 30*time.Second); code != 1 || !strings.Contains(c.stderr.String(), tt.wantErr) {
				t.Fatalf("cocoonctl %v: exit code %d, stderr %q; want 1 and %q", args, code, c.stderr.String(), tt.wantErr)
			}
			if args[0] == "pack" {
				if _, err := os.Stat(args[len(args)-2]); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("a refused pack left an archive (stat: %v)", err)
				}
			}
		})
	}
}

func inspectArgs(link string) []string { return []string{"inspect", link} }

func packArgs(link string) []string {
	return []string{"pack", "--name", "hostile:v1", "--out", link + ".tar", link}
}

func symlink(t *testing.T, target, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
}

// TestInspectArchiveMemory inspects an archive that also holds many
// metadata-sized blobs nothing references: inspect must not keep them.
func TestInspectArchiveMemory(t *testing.T) {
	const (
		blobs    = 48
		blobSize = 4 << 20
		maxRSS   = 96 << 20 // the unreferenced blobs alone are 192 MiB
	)
	root := t.TempDir()
	dirs, _ := makeTestChain(t, root)
	packed := filepath.Join(root, "chain.tar")
	if _, err := runChainCmd(t, "pack", append([]string{"--name", "snap:v1", "--out", packed}, dirs...)...); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(root, "padded.tar")
	padArchive(t, packed, archive, blobs, blobSize)
	c := startCocoonctl(t, nil, "inspect", archive)
	if code := c.wait(t, 2*time.Minute); code != 0 {
		t.Fatalf("inspect: exit code %d, stderr:\n%s", code, c.stderr.String())
	}
	if !strings.HasPrefix(c.stdout.String(), "archive ") {
		t.Fatalf("inspect output:\n%s", c.stdout.String())
	}
	rss := c.maxRSS()
	t.Logf("inspect peak RSS %d MiB with %d MiB of unreferenced blobs", rss>>20, blobs*blobSize>>20)
	if rss > maxRSS {
		t.Fatalf("inspect peaked at %d MiB resident, want at most %d MiB", rss>>20, maxRSS>>20)
	}
}

// padArchive copies the archive src to dst with n unreferenced blobs of
// size bytes each (distinct, correctly named) before its entries.
func padArchive(t *testing.T, src, dst string, n, size int) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	tw := tar.NewWriter(out)
	blob := make([]byte, size)
	for i := range n {
		binary.LittleEndian.PutUint64(blob, uint64(i))
		name := "blobs/sha256/" + digest.FromBytes(blob).Encoded()
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o444, Size: int64(size)}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(blob); err != nil {
			t.Fatal(err)
		}
	}
	tr := tar.NewReader(in)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(tw, tr); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}
