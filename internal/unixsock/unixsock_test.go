package unixsock

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestListenAccepts(t *testing.T) {
	for _, typ := range []int{unix.SOCK_STREAM, unix.SOCK_SEQPACKET} {
		path := filepath.Join(t.TempDir(), "s")
		if Accepts(path, typ) {
			t.Fatal("Accepts with no socket")
		}
		f, err := Listen(path, typ)
		if err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("socket %v mode %v, want 0600", err, fi.Mode().Perm())
		}
		if !Accepts(path, typ) {
			t.Fatal("Accepts on a listening socket = false")
		}
		if _, err := Listen(path, typ); !errors.Is(err, unix.EADDRINUSE) {
			t.Fatalf("second Listen = %v, want EADDRINUSE", err)
		}
		f.Close()
		if Accepts(path, typ) {
			t.Fatal("Accepts on a closed socket's path = true")
		}
	}
}
