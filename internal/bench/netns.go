package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/network"
)

// networkArm runs shim containers whose spec names a network namespace the
// bench made, as CNI leaves one: eth0, a veth whose peer is in another
// namespace the bench made, with an address and a default route via the
// peer. Every link lives in those namespaces, so nothing is named or sent
// anywhere else, and the kernel removes it all once they are closed.
type networkArm struct {
	shimArm
	mu   sync.Mutex
	nets map[string]*network.Namespace // by clone id, for the cell running
}

// maxNetworkClones is how many clones one cell's addressing (10.99.I.0/24
// per clone I) has room for.
const maxNetworkClones = 250

func newNetworkArm(a shimArm) *networkArm {
	n := &networkArm{}
	a.opts = n.namespaceOf
	n.shimArm = a
	return n
}

// namespaceOf is the spec option naming clone id's namespace.
func (a *networkArm) namespaceOf(id string) []oci.SpecOpts {
	a.mu.Lock()
	defer a.mu.Unlock()
	return []oci.SpecOpts{oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: a.nets[id].Path()})}
}

// prepare makes a namespace per clone and the peer namespace they all
// connect to.
func (a *networkArm) prepare(_ context.Context, ids []string) (func() error, error) {
	if len(ids) > maxNetworkClones {
		return nil, fmt.Errorf("network arm: %d clones: at most %d", len(ids), maxNetworkClones)
	}
	peer, err := network.New()
	if err != nil {
		return nil, err
	}
	all := []*network.Namespace{peer}
	cleanup := func() error {
		a.mu.Lock()
		a.nets = nil
		a.mu.Unlock()
		var errs []error
		for _, n := range all {
			errs = append(errs, n.Close())
		}
		return errors.Join(errs...)
	}
	nets := map[string]*network.Namespace{}
	for i, id := range ids {
		n, err := network.New()
		if err != nil {
			return nil, errors.Join(err, cleanup())
		}
		all = append(all, n)
		nets[id] = n
		if err := addPodLink(n, peer, i); err != nil {
			return nil, errors.Join(fmt.Errorf("network of %s: %w", id, err), cleanup())
		}
	}
	a.mu.Lock()
	a.nets = nets
	a.mu.Unlock()
	return cleanup, nil
}

// addPodLink gives n an eth0 at 10.99.i.2/24 with a default route via
// 10.99.i.1, its veth peer "v<i>" in peer.
func addPodLink(n, peer *network.Namespace, i int) error {
	h, err := netlink.NewHandleAt(netns.NsHandle(n.File().Fd()), unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("open netlink: %w", err)
	}
	defer h.Close()
	peerName := fmt.Sprintf("v%d", i)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: peerName, PeerNamespace: netlink.NsFd(peer.File().Fd())}
	if err := h.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth: %w", err)
	}
	eth0, err := upWithAddr(h, "eth0", fmt.Sprintf("10.99.%d.2/24", i))
	if err != nil {
		return err
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: net.IPv4(10, 99, byte(i), 1)}); err != nil {
		return fmt.Errorf("add default route: %w", err)
	}
	ph, err := netlink.NewHandleAt(netns.NsHandle(peer.File().Fd()), unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("open netlink: %w", err)
	}
	defer ph.Close()
	_, err = upWithAddr(ph, peerName, fmt.Sprintf("10.99.%d.1/24", i))
	return err
}

// upWithAddr gives link name the address cidr and sets it up.
func upWithAddr(h *netlink.Handle, name, cidr string) (netlink.Link, error) {
	link, err := h.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("find %s: %w", name, err)
	}
	addr, err := netlink.ParseAddr(cidr)
	if err != nil {
		return nil, err
	}
	if err := h.AddrAdd(link, addr); err != nil {
		return nil, fmt.Errorf("address %s on %s: %w", cidr, name, err)
	}
	if err := h.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("set %s up: %w", name, err)
	}
	return link, nil
}
