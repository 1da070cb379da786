package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/shutdown"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/unixsock"
)

// listenTemp listens on a unix socket in a temp dir, closed at cleanup.
func listenTemp(t *testing.T) (string, *os.File) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "task.sock")
	sock, err := unixsock.Listen(path, unix.SOCK_STREAM)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sock.Close() })
	return path, sock
}

func TestServedPath(t *testing.T) {
	path, sock := listenTemp(t)
	unbound, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(unbound) })
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	for _, tc := range []struct {
		name string
		fd   int
		want string
	}{
		{"listening socket", int(sock.Fd()), path},
		{"unbound socket", unbound, ""},
		{"pipe", int(r.Fd()), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := servedPath(tc.fd)
			if got != tc.want || (err == nil) != (tc.want != "") {
				t.Fatalf("servedPath = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestSocketGoneWhileShutdownLasts: the socket's path is gone as soon as
// the shutdown begins, while another callback still holds the process, so
// `shim delete` and the next start find no live socket there.
func TestSocketGoneWhileShutdownLasts(t *testing.T) {
	path, _ := listenTemp(t)
	_, sd := shutdown.WithShutdown(context.Background())
	release := make(chan struct{})
	var once sync.Once
	releaseHold := func() { once.Do(func() { close(release) }) }
	t.Cleanup(releaseHold) // the holding callback ends with the test
	sd.RegisterCallback(func(context.Context) error { <-release; return nil })
	unlinkOnShutdown(t.Context(), sd, path)
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("socket gone before the shutdown: %v", err)
	}
	sd.Shutdown()
	deadline := time.Now().Add(5 * time.Second)
	for _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist); _, err = os.Stat(path) {
		if time.Now().After(deadline) {
			t.Fatalf("socket still there while the shutdown lasts: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case <-sd.Done():
		t.Fatal("shutdown done before its other callback ended")
	default:
	}
	releaseHold()
	<-sd.Done()
	if err := sd.Err(); !errors.Is(err, shutdown.ErrShutdown) {
		t.Fatalf("shutdown error %v, want only ErrShutdown", err)
	}
}
