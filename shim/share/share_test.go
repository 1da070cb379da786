package share

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/server/shares"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// TestMain runs the test binary as the helper when Serve starts it so.
func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == Argv0 {
		Main()
		return
	}
	os.Exit(m.Run())
}

// guestEnd is the guest agent's share code run on this host: its FUSE
// mount is in this machine's kernel, as the guest's is in the VM's.
type guestEnd struct {
	s  *shares.Shares
	id uint64
}

func (g guestEnd) Read(ctx context.Context) ([][]byte, bool, error) {
	r, err := g.s.ReadShare(ctx, &api.ReadShareRequest{Id: g.id})
	if err != nil {
		return nil, false, err
	}
	return r.Requests, r.Eof, nil
}

func (g guestEnd) Write(ctx context.Context, replies [][]byte) error {
	_, err := g.s.WriteShare(ctx, &api.WriteShareRequest{Id: g.id, Replies: replies})
	return err
}

func (g guestEnd) Close(ctx context.Context) error {
	_, err := g.s.CloseShare(ctx, &api.CloseShareRequest{Id: g.id})
	return err
}

// serveDir shares a new host directory at a new mount point, as a pod's
// VM would see it; it returns both.
func serveDir(t *testing.T, access Access) (host, guest string, srv *Server) {
	return serveDirAt(t, t.TempDir(), access)
}

// serveDirAt shares host directory host.
func serveDirAt(t *testing.T, host string, access Access) (_, guest string, srv *Server) {
	t.Helper()
	testenv.RequireRoot(t)
	if _, err := os.Stat("/dev/fuse"); err != nil {
		testenv.Unavailable(t, "/dev/fuse ("+err.Error()+")")
	}
	binds := t.TempDir()
	guest = filepath.Join(binds, "share")
	s := shares.New(binds)
	ctx := context.Background()
	resp, err := s.OpenShare(ctx, &api.OpenShareRequest{Path: guest})
	if err != nil {
		t.Fatal(err)
	}
	srv, err = Serve(ctx, guestEnd{s: s, id: resp.Id}, host, access)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Close(ctx); err != nil {
			t.Error(err)
		}
	})
	return host, guest, srv
}

func TestShareLive(t *testing.T) {
	host, guest, _ := serveDir(t, ReadWrite)
	if err := os.WriteFile(filepath.Join(host, "from-host"), []byte("h"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(guest, "from-host")); err != nil || string(b) != "h" {
		t.Fatalf("guest reads the host's file: %q, %v", b, err)
	}
	if err := os.MkdirAll(filepath.Join(guest, "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(guest, "a", "b", "f"), []byte("g"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(guest, "a", "b", "f"), filepath.Join(guest, "a", "g")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(host, "a", "g")); err != nil || string(b) != "g" {
		t.Fatalf("host reads the guest's file: %q, %v", b, err)
	}
	if err := os.Remove(filepath.Join(guest, "from-host")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(host, "from-host")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a file the guest removed is on the host: %v", err)
	}
}

// TestShareHostMount: a mount the host makes under the directory after
// the share started shows in the guest (rslave's propagation from host to
// container); one made in the guest's share stays there.
func TestShareHostMount(t *testing.T) {
	testenv.RequireRoot(t)
	// As critest does: the directory is a shared mount, so that what
	// is mounted under it propagates (this host's root is private).
	shared := t.TempDir()
	if err := unix.Mount(shared, shared, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(shared, unix.MNT_DETACH) })
	if err := unix.Mount("", shared, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	host, guest, _ := serveDirAt(t, shared, ReadWrite)
	mnt := filepath.Join(host, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("cocoon-test", mnt, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(mnt, "on-tmpfs"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(guest, "mnt", "on-tmpfs")); err != nil {
		t.Fatalf("the host's new mount does not show in the guest: %v", err)
	}
}

func TestShareRefusals(t *testing.T) {
	_, guest, _ := serveDir(t, ReadWrite)
	if err := unix.Mknod(filepath.Join(guest, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); !errors.Is(err, syscall.EPERM) {
		t.Errorf("mknod of a device in the share: %v, want EPERM", err)
	}
	if err := unix.Mkfifo(filepath.Join(guest, "fifo"), 0o600); err != nil {
		t.Errorf("mkfifo in the share: %v", err)
	}
	f := filepath.Join(guest, "x")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(f, "trusted.overlay.opaque", []byte("y"), 0); !errors.Is(err, syscall.EPERM) {
		t.Errorf("setxattr trusted.*: %v, want EPERM", err)
	}
}

// TestShareReadOnly: a read-only share refuses writes to the directory,
// and to the mounts under it only when recursive, as runc's ro and rro
// binds do; the helper enforces it, whatever the guest's mount says.
func TestShareReadOnly(t *testing.T) {
	for _, tc := range []struct {
		access    Access
		subWrites bool
	}{{ReadOnly, true}, {RecursiveReadOnly, false}} {
		t.Run(accessArgs[tc.access], func(t *testing.T) {
			testenv.RequireRoot(t)
			host := t.TempDir()
			sub := filepath.Join(host, "tmpfs")
			if err := os.Mkdir(sub, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := unix.Mount("cocoon-test", sub, "tmpfs", 0, "size=64k"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = unix.Unmount(sub, unix.MNT_DETACH) })
			if err := os.WriteFile(filepath.Join(host, "f"), []byte("h"), 0o644); err != nil {
				t.Fatal(err)
			}
			_, guest, _ := serveDirAt(t, host, tc.access)
			if b, err := os.ReadFile(filepath.Join(guest, "f")); err != nil || string(b) != "h" {
				t.Fatalf("guest reads: %q, %v", b, err)
			}
			if err := os.WriteFile(filepath.Join(guest, "g"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
				t.Errorf("write to the directory: %v, want EROFS", err)
			}
			err := os.WriteFile(filepath.Join(guest, "tmpfs", "g"), nil, 0o644)
			if tc.subWrites && err != nil {
				t.Errorf("write to the mount under it: %v", err)
			}
			if !tc.subWrites && !errors.Is(err, syscall.EROFS) {
				t.Errorf("write to the mount under it: %v, want EROFS", err)
			}
		})
	}
}

// TestShareClose: Close unmounts the share, and the helper is gone.
func TestShareClose(t *testing.T) {
	_, guest, srv := serveDir(t, ReadWrite)
	if _, err := os.ReadDir(guest); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(guest); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the share's mount point is left: %v", err)
	}
	if err := srv.helper.Process.Signal(syscall.Signal(0)); err == nil {
		t.Error("the helper still runs")
	}
}

// TestShareHelperDies: a helper that ends before Close closes the share,
// so the guest's next request fails instead of waiting forever.
func TestShareHelperDies(t *testing.T) {
	_, guest, srv := serveDir(t, ReadWrite)
	if err := os.WriteFile(filepath.Join(guest, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Opened before the kill: once the share is closed its mount point
	// is an empty directory for a new lookup, until it is removed.
	dir, err := os.Open(guest)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	if err := srv.helper.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-srv.exited
	done := make(chan error, 1)
	go func() {
		_, err := dir.ReadDir(-1)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Error("the share still answers with its helper gone")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a request of a share whose helper died hangs")
	}
}

// TestShareHoldsNoHostMounts: the helper's mount namespace holds the
// directory and nothing else of the host's, so no file system the host
// unmounts stays alive in it.
func TestShareHoldsNoHostMounts(t *testing.T) {
	_, guest, srv := serveDir(t, ReadWrite)
	if _, err := os.ReadDir(guest); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", srv.helper.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(string(b)), "\n"); len(lines) != 1 || strings.Fields(lines[0])[4] != "/" {
		t.Errorf("the helper's mounts:\n%s\nwant its root alone", b)
	}
}
