package chain

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestOpenLinkFile(t *testing.T) {
	dir := t.TempDir()
	regular := filepath.Join(dir, "regular")
	if err := os.WriteFile(regular, []byte("0123456789"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(regular, link); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		path    string
		max     int64
		wantErr string
	}{
		{"regular", regular, 10, ""},
		{"too large", regular, 9, "10 bytes, larger than the 9 allowed"},
		{"symlink", link, 10, "a symbolic link, want a regular file"},
		{"fifo", fifo, 10, "a FIFO, want a regular file"},
		{"directory", dir, 10, "a directory, want a regular file"},
		{"device", "/dev/zero", 10, "a character device, want a regular file"},
		{"missing", filepath.Join(dir, "none"), 10, "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := ReadLinkFile(tt.path, tt.max)
			if tt.wantErr == "" {
				if err != nil || string(b) != "0123456789" {
					t.Fatalf("ReadLinkFile = %q, %v", b, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("ReadLinkFile error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestCopyStateFile(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "qemu.state")
	if err := os.WriteFile(src, []byte("device state"), 0o444); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "copy")
	if err := CopyStateFile(src, dst); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(dst); err != nil || string(b) != "device state" {
		t.Fatalf("copy holds %q, %v", b, err)
	}
	if fi, err := os.Stat(dst); err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("copy mode %v, %v; want 0644 (private, patchable)", fi.Mode(), err)
	}

	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	linked := filepath.Join(dir, "linked.state")
	if err := os.Symlink(secret, linked); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	if err := CopyStateFile(linked, out); err == nil || !strings.Contains(err.Error(), "a symbolic link") {
		t.Fatalf("copy of a symlinked state file: %v", err)
	}
	if _, err := os.Lstat(out); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused copy left %s (%v)", out, err)
	}
	trap := filepath.Join(dir, "trap")
	if err := os.Symlink(secret, trap); err != nil {
		t.Fatal(err)
	}
	if err := CopyStateFile(src, trap); err == nil {
		t.Fatal("copy onto a symlink followed it")
	}
	if b, _ := os.ReadFile(secret); string(b) != "host secret" {
		t.Fatalf("copy wrote through a symlink: the host file holds %q", b)
	}
	big := filepath.Join(dir, "big.state")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(MaxStateFile + 1); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := CopyStateFile(big, out); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("copy of an oversized state file: %v", err)
	}
}
