package network

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// Every link these tests create lives in a namespace the test made (New),
// so names cannot collide with anything else on the machine, and the
// kernel removes it all when the namespaces' last holders close.

// newNS is a fresh namespace closed at cleanup.
func newNS(t testing.TB) *Namespace {
	t.Helper()
	testenv.RequireRoot(t)
	n, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// inNS runs fn with a netlink handle inside n.
func inNS(t testing.TB, n *Namespace, fn func(h *netlink.Handle) error) {
	t.Helper()
	h, err := n.handle()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := fn(h); err != nil {
		t.Fatal(err)
	}
}

// addVeth creates veth name in n with its peer peerName in peerNS, both
// up, name with mtu (0: default) and addrs (CIDR strings).
func addVeth(t testing.TB, n *Namespace, name string, mtu int, peerNS *Namespace, peerName string, addrs ...string) netlink.Link {
	t.Helper()
	var link netlink.Link
	inNS(t, n, func(h *netlink.Handle) error {
		veth := &netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: name, MTU: mtu},
			PeerName:      peerName,
			PeerNamespace: netlink.NsFd(peerNS.File().Fd()),
		}
		if err := h.LinkAdd(veth); err != nil {
			return err
		}
		var err error
		if link, err = h.LinkByName(name); err != nil {
			return err
		}
		for _, a := range addrs {
			if err := addAddr(h, link, a); err != nil {
				return err
			}
		}
		return h.LinkSetUp(link)
	})
	inNS(t, peerNS, func(h *netlink.Handle) error {
		peer, err := h.LinkByName(peerName)
		if err != nil {
			return err
		}
		return h.LinkSetUp(peer)
	})
	return link
}

// addAddr adds cidr to link without duplicate address detection, so IPv6
// addresses are usable at once.
func addAddr(h *netlink.Handle, link netlink.Link, cidr string) error {
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		return err
	}
	a.Flags = unix.IFA_F_NODAD
	return h.AddrAdd(link, a)
}

// addRoute adds dst (CIDR, "" = default of gw's family) via gw on link.
func addRoute(t testing.TB, n *Namespace, link netlink.Link, dst, gw string, metric int) {
	t.Helper()
	r := &netlink.Route{LinkIndex: link.Attrs().Index, Gw: net.ParseIP(gw), Priority: metric}
	if dst != "" {
		_, d, err := net.ParseCIDR(dst)
		if err != nil {
			t.Fatal(err)
		}
		r.Dst = d
	}
	inNS(t, n, func(h *netlink.Handle) error { return h.RouteAdd(r) })
}

// pod is a namespace shaped like CNI leaves one: eth0 (a veth to the
// peer namespace, MTU 1400) with IPv4 and IPv6 addresses and default
// routes via the peer.
type pod struct {
	ns, peer       *Namespace
	eth0, peerLink netlink.Link
	ip4, peerIP4   net.IP
	ip6, peerIP6   net.IP
	mac, peerMAC   net.HardwareAddr
}

func newPod(t testing.TB) *pod {
	t.Helper()
	p := &pod{
		ns: newNS(t), peer: newNS(t),
		ip4: net.ParseIP("10.1.2.2").To4(), peerIP4: net.ParseIP("10.1.2.1").To4(),
		ip6: net.ParseIP("fd00:1::2"), peerIP6: net.ParseIP("fd00:1::1"),
	}
	p.eth0 = addVeth(t, p.ns, "eth0", 1400, p.peer, "peer0", "10.1.2.2/24", "fd00:1::2/64")
	inNS(t, p.peer, func(h *netlink.Handle) error {
		var err error
		if p.peerLink, err = h.LinkByName("peer0"); err != nil {
			return err
		}
		for _, a := range []string{"10.1.2.1/24", "fd00:1::1/64"} {
			if err := addAddr(h, p.peerLink, a); err != nil {
				return err
			}
		}
		return nil
	})
	addRoute(t, p.ns, p.eth0, "", "10.1.2.1", 0)
	addRoute(t, p.ns, p.eth0, "", "fd00:1::1", 0)
	p.mac = p.eth0.Attrs().HardwareAddr
	p.peerMAC = p.peerLink.Attrs().HardwareAddr
	return p
}

// uniqueTapName is a tap name no other test run shares.
func uniqueTapName(t testing.TB) string {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return TapName(t.Name() + hex.EncodeToString(b))
}

// testTap creates a tap in n, releasing it and closing its queue at
// cleanup.
func testTap(t testing.TB, n *Namespace, iface string) *Tap {
	t.Helper()
	tap, err := CreateTap(n, uniqueTapName(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		tap.File.Close()
		if err := Release(n.Path(), iface, tap.Name); err != nil {
			t.Error(err)
		}
	})
	return tap
}

// nsInode is the inode naming the namespace behind path.
func nsInode(t testing.TB, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}
