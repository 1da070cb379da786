package network

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
)

func routeStrings(routes []Route) []string {
	var out []string
	for _, r := range routes {
		s := fmt.Sprintf("%s via %s metric %d", dstString(r.Dst), r.Gw, r.Metric)
		if r.OnLink {
			s += " onlink"
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

func addrStrings(addrs []net.IPNet) []string {
	var out []string
	for _, a := range addrs {
		out = append(out, a.String())
	}
	slices.Sort(out)
	return out
}

// TestDiscoverPod: in a CNI-shaped namespace Discover returns eth0 with
// its MAC, MTU, global addresses and non-kernel routes, v4 and v6.
func TestDiscoverPod(t *testing.T) {
	p := newPod(t)
	addRoute(t, p.ns, p.eth0, "192.168.50.0/24", "10.1.2.1", 7)
	got, err := Discover(p.ns)
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "eth0" || got.Index != p.eth0.Attrs().Index || got.MTU != 1400 || got.MAC.String() != p.mac.String() {
		t.Errorf("Discover = %s index %d mtu %d mac %s; want eth0 index %d mtu 1400 mac %s",
			got.Name, got.Index, got.MTU, got.MAC, p.eth0.Attrs().Index, p.mac)
	}
	if a, want := addrStrings(got.Addrs), []string{"10.1.2.2/24", "fd00:1::2/64"}; !slices.Equal(a, want) {
		t.Errorf("addresses = %v, want %v", a, want)
	}
	want := []string{
		"192.168.50.0/24 via 10.1.2.1 metric 7",
		"default via 10.1.2.1 metric 0",
		"default via fd00:1::1 metric 1024",
	}
	if r := routeStrings(got.Routes); !slices.Equal(r, want) {
		t.Errorf("routes = %v, want %v", r, want)
	}
}

// TestDiscoverDefaultWithoutGateway: a default route straight out of the
// interface ("default dev eth0", as ipvlan L3 and hand-made veths have it)
// keeps its family in Dst, since it has no gateway to say it.
func TestDiscoverDefaultWithoutGateway(t *testing.T) {
	n, far := newNS(t), newNS(t)
	eth0 := addVeth(t, n, "eth0", 0, far, "f0", "10.4.0.2/24", "fd00:4::2/64")
	addRoute(t, n, eth0, "0.0.0.0/0", "", 0)
	addRoute(t, n, eth0, "::/0", "", 0)
	got, err := Discover(n)
	if err != nil {
		t.Fatal(err)
	}
	var dsts []string
	for _, r := range got.Routes {
		if r.Gw != nil {
			t.Errorf("route %+v has a gateway, want none", r)
		}
		dsts = append(dsts, r.Dst.String())
	}
	slices.Sort(dsts)
	if want := []string{"0.0.0.0/0", "::/0"}; !slices.Equal(dsts, want) {
		t.Errorf("default routes' destinations = %v, want %v", dsts, want)
	}
}

// TestDiscover: which interface is chosen, and the errors when none or
// several qualify.
func TestDiscover(t *testing.T) {
	tests := []struct {
		name   string
		setup  func(t *testing.T, n, far *Namespace)
		want   string   // interface name
		routes []string // its routes, when want is set
		err    string   // error substring, when want is empty
	}{{
		name: "the only interface with an address",
		setup: func(t *testing.T, n, far *Namespace) {
			addVeth(t, n, "eth1", 0, far, "f1", "10.3.0.2/24")
			addVeth(t, n, "eth2", 0, far, "f2")
		},
		want: "eth1",
	}, {
		name: "the default route's interface among several with addresses",
		setup: func(t *testing.T, n, far *Namespace) {
			addVeth(t, n, "eth1", 0, far, "f1", "10.3.0.2/24")
			eth2 := addVeth(t, n, "eth2", 0, far, "f2", "10.4.0.2/24")
			addRoute(t, n, eth2, "", "10.4.0.1", 0)
		},
		want:   "eth2",
		routes: []string{"default via 10.4.0.1 metric 0"},
	}, {
		name: "an on-link gateway outside every prefix",
		setup: func(t *testing.T, n, far *Namespace) {
			eth1 := addVeth(t, n, "eth1", 0, far, "f1", "10.5.0.7/32")
			inNS(t, n, func(h *netlink.Handle) error {
				return h.RouteAdd(&netlink.Route{
					LinkIndex: eth1.Attrs().Index, Gw: net.ParseIP("169.254.1.1"), Flags: int(netlink.FLAG_ONLINK),
				})
			})
		},
		want:   "eth1",
		routes: []string{"default via 169.254.1.1 metric 0 onlink"},
	}, {
		name:  "nothing but lo",
		setup: func(t *testing.T, n, far *Namespace) {},
		err:   "no default route and no interface with a global address (links: lo [no global address])",
	}, {
		name: "link-local addresses only",
		setup: func(t *testing.T, n, far *Namespace) {
			addVeth(t, n, "eth1", 0, far, "f1", "fe80::1/64")
		},
		err: "eth1 [no global address]",
	}, {
		name: "several interfaces with addresses",
		setup: func(t *testing.T, n, far *Namespace) {
			addVeth(t, n, "eth1", 0, far, "f1", "10.3.0.2/24")
			addVeth(t, n, "eth2", 0, far, "f2", "fd00:4::2/64")
		},
		err: "several interfaces with addresses (eth1 [10.3.0.2/24], eth2 [fd00:4::2/64]); want exactly one",
	}, {
		name: "default routes on several interfaces",
		setup: func(t *testing.T, n, far *Namespace) {
			eth1 := addVeth(t, n, "eth1", 0, far, "f1", "10.3.0.2/24")
			eth2 := addVeth(t, n, "eth2", 0, far, "f2", "fd00:4::2/64")
			addRoute(t, n, eth1, "", "10.3.0.1", 0)
			addRoute(t, n, eth2, "", "fd00:4::1", 0)
		},
		err: "default routes on several interfaces (eth1 [10.3.0.2/24], eth2 [fd00:4::2/64])",
	}, {
		name: "a multipath route over the interface",
		setup: func(t *testing.T, n, far *Namespace) {
			eth1 := addVeth(t, n, "eth1", 0, far, "f1", "10.3.0.2/24")
			i := eth1.Attrs().Index
			inNS(t, n, func(h *netlink.Handle) error {
				_, all, _ := net.ParseCIDR("0.0.0.0/0")
				return h.RouteAdd(&netlink.Route{Dst: all, MultiPath: []*netlink.NexthopInfo{
					{LinkIndex: i, Gw: net.ParseIP("10.3.0.1")},
					{LinkIndex: i, Gw: net.ParseIP("10.3.0.3")},
				}})
			})
		},
		err: "route default via eth1 has several next hops",
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n, far := newNS(t), newNS(t)
			tc.setup(t, n, far)
			got, err := Discover(n)
			if tc.want == "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Discover error = %v, want one containing %q", err, tc.err)
				}
				// Only a namespace with nothing to take over is ErrNoInterface:
				// the shim leaves the guest's NIC down for it.
				if noIface := strings.Contains(tc.err, "no interface with a global address") || strings.Contains(tc.err, "[no global address]"); errors.Is(err, ErrNoInterface) != noIface {
					t.Fatalf("errors.Is(%v, ErrNoInterface) = %v, want %v", err, !noIface, noIface)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Name != tc.want {
				t.Errorf("Discover chose %s, want %s", got.Name, tc.want)
			}
			if r := routeStrings(got.Routes); !slices.Equal(r, tc.routes) {
				t.Errorf("routes = %v, want %v", r, tc.routes)
			}
		})
	}
}
