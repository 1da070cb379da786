package vm

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containernetworking/plugins/pkg/testutils"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
	"github.com/cocoonstack/containerd-shim-cocoon/network"
)

// TestNetworkReleaseUnpinned: a namespace unpinned while its VM runs
// (`ip netns delete` of a pod's namespace) lives on while the shim holds
// it; Release still deletes the tap there, or the tap and its redirects
// would outlive the task.
func TestNetworkReleaseUnpinned(t *testing.T) {
	testenv.RequireRoot(t)
	pinned, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pinned.Close(); _ = testutils.UnmountNS(pinned) })
	spec := &specs.Spec{Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.NetworkNamespace, Path: pinned.Path()}}}}
	n, err := openNetwork(spec, "t1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Release() })
	held, err := network.Open(pinned.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { held.Close() })
	if err := unix.Unmount(pinned.Path(), unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(pinned.Path()); err != nil {
		t.Fatal(err)
	}
	if err := n.Release(); err != nil {
		t.Fatalf("Release: %v", err)
	}
	err = held.Do(func() error {
		_, err := netlink.LinkByName(n.tap.Name)
		return err
	})
	if !errors.As(err, new(netlink.LinkNotFoundError)) {
		t.Fatalf("tap %s after Release: %v, want not found", n.tap.Name, err)
	}
}

// TestNetworkRefusesSpecPath: a spec naming anything but a network
// namespace fails at once as an invalid argument naming the path and what
// it is; a FIFO nobody writes to used to block the create for good.
func TestNetworkRefusesSpecPath(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, want string }{
		{fifo, fifo + ": a FIFO, not a network namespace"},
		{dir, dir + ": a directory, not a network namespace"},
		{"/proc/self/ns/uts", "a namespace of another type, not a network namespace"},
	} {
		spec := &specs.Spec{Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.NetworkNamespace, Path: tc.path}}}}
		errc := make(chan error, 1)
		go func() {
			n, err := openNetwork(spec, "t1")
			errc <- errors.Join(err, n.Release())
		}()
		select {
		case err := <-errc:
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("openNetwork of %s: %v; want an invalid argument containing %q", tc.path, err, tc.want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("openNetwork of %s still blocks after 10s", tc.path)
		}
	}
}
