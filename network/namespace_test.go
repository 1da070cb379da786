package network

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/cnitest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// TestNew: every New namespace is distinct from the caller's and from each
// other, and has lo up.
func TestNew(t *testing.T) {
	a, b := newNS(t), newNS(t)
	self := nsInode(t, "/proc/self/ns/net")
	ia, ib := nsInode(t, a.Path()), nsInode(t, b.Path())
	if ia == self || ib == self || ia == ib {
		t.Fatalf("namespace inodes: self %d, a %d, b %d; want three distinct", self, ia, ib)
	}
	inNS(t, a, func(h *netlink.Handle) error {
		lo, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		if lo.Attrs().Flags&net.FlagUp == 0 {
			t.Error("lo is down in a New namespace")
		}
		return nil
	})
}

// TestNewGoneAfterClose: once its Namespace is closed and nothing else
// holds it, the kernel destroys a New namespace; its veth to another
// namespace disappears with it.
func TestNewGoneAfterClose(t *testing.T) {
	observer := newNS(t)
	n, err := New()
	if err != nil {
		t.Fatal(err)
	}
	addVeth(t, n, "v0", 0, observer, "o0")
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	h, err := observer.handle()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	// Namespace teardown runs in a kernel work queue, so wait for it.
	testenv.Eventually(t, 30*time.Second, "the closed namespace destroyed (its veth peer gone)", func() error {
		_, err := h.LinkByName("o0")
		if isNotFound(err) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		return errors.New("the veth peer is still there")
	})
}

// TestOpen: Open accepts network namespace files and names what is wrong
// with anything else.
func TestOpen(t *testing.T) {
	n := newNS(t)
	// CNI and CRI pin namespaces as bind mounts under /run/netns.
	pinned := cnitest.NewNamespace(t)
	dir := t.TempDir()
	regular := filepath.Join(dir, "netns")
	if err := os.WriteFile(regular, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// A FIFO nobody writes to: opening it for reading would block for good.
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path string
		err  string
	}{
		{path: n.Path()},
		{path: pinned.Path},
		{path: "/proc/self/ns/net"},
		{path: regular, err: regular + ": a regular file, not a network namespace"},
		{path: fifo, err: fifo + ": a FIFO, not a network namespace"},
		{path: "/dev/null", err: "/dev/null: a character device, not a network namespace"},
		{path: dir, err: dir + ": a directory, not a network namespace"},
		{path: "/proc/self/ns/mnt", err: "a namespace of another type, not a network namespace"},
		{path: filepath.Join(dir, "missing"), err: "no such file or directory"},
	}
	for _, tc := range tests {
		got, err := openWithin(t, tc.path, 10*time.Second)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Open(%s) error = %v, want one containing %q", tc.path, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("Open(%s): %v", tc.path, err)
			continue
		}
		if got.Path() != tc.path || nsInode(t, tc.path) != nsInode(t, fmt.Sprintf("/proc/self/fd/%d", got.File().Fd())) {
			t.Errorf("Open(%s) = %s, not the namespace asked for", tc.path, got.Path())
		}
		got.Close()
	}
}

// openWithin is Open, failing the test if it blocks for longer than d.
func openWithin(t *testing.T, path string, d time.Duration) (*Namespace, error) {
	t.Helper()
	type result struct {
		n   *Namespace
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := Open(path)
		done <- result{n, err}
	}()
	select {
	case r := <-done:
		return r.n, r.err
	case <-time.After(d):
		t.Fatalf("Open(%s) still blocks after %s", path, d)
		return nil, nil
	}
}

// TestDo: a process started from fn is born in the namespace, fn's error
// comes back, and the caller's namespace is untouched.
func TestDo(t *testing.T) {
	readlink := testenv.LookPath(t, "readlink")
	n := newNS(t)
	want := fmt.Sprintf("net:[%d]", nsInode(t, n.Path()))
	var out []byte
	err := n.Do(func() error {
		var err error
		out, err = exec.Command(readlink, "/proc/self/ns/net").Output()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(out)); got != want {
		t.Errorf("child started in Do is in %s, want %s", got, want)
	}
	sentinel := errors.New("from fn")
	if err := n.Do(func() error { return sentinel }); !errors.Is(err, sentinel) {
		t.Errorf("Do returned %v, want fn's error", err)
	}
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	if self == want {
		t.Error("the test process itself ended up in the namespace")
	}
}
