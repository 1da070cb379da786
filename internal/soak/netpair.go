package soak

import (
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// The addresses of a pair. Every pair lives in namespaces of its own, so
// all pairs can use the same ones.
var (
	taskAddr = &net.IPNet{IP: net.IPv4(10, 213, 7, 2), Mask: net.CIDRMask(24, 32)}
	peerAddr = &net.IPNet{IP: net.IPv4(10, 213, 7, 1), Mask: net.CIDRMask(24, 32)}
)

// pairIface and peerIface are the veth's two ends.
const (
	pairIface = "eth0"
	peerIface = "peer0"
)

// netPair is a task's network namespace with a veth to a peer namespace:
// the task's end has an address and a default route via the peer's, so the
// shim hands it to the guest; traffic goes only between the two.
type netPair struct {
	task, peer ns.NetNS
}

// pairs tracks the soak's live namespace pairs, for the census.
type pairs struct {
	mu   sync.Mutex
	live map[*netPair]struct{}
}

// open makes a pair and tracks it until close.
func (ps *pairs) open() (*netPair, error) {
	p := &netPair{}
	var err error
	if p.task, err = testutils.NewNS(); err != nil {
		return nil, fmt.Errorf("create task network namespace: %w", err)
	}
	if p.peer, err = testutils.NewNS(); err != nil {
		return nil, errors.Join(fmt.Errorf("create peer network namespace: %w", err), p.remove())
	}
	if err := p.link(); err != nil {
		return nil, errors.Join(err, p.remove())
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.live == nil {
		ps.live = map[*netPair]struct{}{}
	}
	ps.live[p] = struct{}{}
	return p, nil
}

// close removes a pair's namespaces.
func (ps *pairs) close(p *netPair) error {
	ps.mu.Lock()
	delete(ps.live, p)
	ps.mu.Unlock()
	return p.remove()
}

// paths lists the live pairs' namespace paths.
func (ps *pairs) paths() []string {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var out []string
	for p := range ps.live {
		out = append(out, p.task.Path(), p.peer.Path())
	}
	return out
}

// link adds the veth, its addresses, the task's default route and lo.
func (p *netPair) link() error {
	th, err := handleAt(p.task.Path())
	if err != nil {
		return err
	}
	defer th.Close()
	ph, err := handleAt(p.peer.Path())
	if err != nil {
		return err
	}
	defer ph.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: pairIface}, PeerName: peerIface, PeerNamespace: netlink.NsFd(int(p.peer.Fd()))}
	if err := th.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth: %w", err)
	}
	if err := up(th, pairIface, taskAddr); err != nil {
		return err
	}
	if err := up(ph, peerIface, peerAddr); err != nil {
		return err
	}
	link, err := th.LinkByName(pairIface)
	if err != nil {
		return fmt.Errorf("find %s: %w", pairIface, err)
	}
	if err := th.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Gw: peerAddr.IP}); err != nil {
		return fmt.Errorf("add default route: %w", err)
	}
	return nil
}

// up brings lo and the link name up, with addr on the latter.
func up(h *netlink.Handle, name string, addr *net.IPNet) error {
	for _, n := range []string{"lo", name} {
		l, err := h.LinkByName(n)
		if err != nil {
			return fmt.Errorf("find %s: %w", n, err)
		}
		if n == name {
			if err := h.AddrAdd(l, &netlink.Addr{IPNet: addr}); err != nil {
				return fmt.Errorf("address %s: %w", n, err)
			}
		}
		if err := h.LinkSetUp(l); err != nil {
			return fmt.Errorf("set %s up: %w", n, err)
		}
	}
	return nil
}

func (p *netPair) remove() error {
	var errs []error
	for _, n := range []ns.NetNS{p.task, p.peer} {
		if n == nil {
			continue
		}
		n.Close()
		if err := testutils.UnmountNS(n); err != nil {
			errs = append(errs, fmt.Errorf("remove network namespace: %w", err))
		}
	}
	return errors.Join(errs...)
}

// handleAt is a netlink handle inside the namespace at path.
func handleAt(path string) (*netlink.Handle, error) {
	nsh, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("open network namespace %s: %w", path, err)
	}
	defer nsh.Close()
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", path, err)
	}
	return h, nil
}
