package vm

import (
	"errors"
	"os"
	"testing"

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
