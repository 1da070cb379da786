package network

import (
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Interface is the namespace's interface a VM takes over, with what the
// guest needs to impersonate it.
type Interface struct {
	Name  string
	Index int
	MAC   net.HardwareAddr
	MTU   int
	// Addrs are the global IPv4 and IPv6 addresses (no link-local ones).
	Addrs []net.IPNet
	// Routes are the interface's routes in the main table that the kernel
	// did not derive from an address (the default route, extra ones).
	Routes []Route
}

// Route is one route of an Interface, as the guest should install it (a
// per-route MTU is not carried: the guest's NIC has the interface's).
type Route struct {
	// Dst is 0.0.0.0/0 or ::/0 for a default route, so that one without
	// a gateway still says its family.
	Dst    *net.IPNet
	Gw     net.IP // nil for a directly connected destination
	Src    net.IP // preferred source, nil when unset
	Metric int
	OnLink bool // the gateway is on the link though no prefix says so
}

// ErrNoInterface is Discover's error for a namespace with nothing to take
// over: only loopback, or interfaces without addresses.
var ErrNoInterface = errors.New("no interface to take over")

// Discover finds the interface of n that the VM takes over: the one
// carrying the default route, else the only non-loopback one with a global
// address. It fails, listing what is there, when none or several qualify.
func Discover(n *Namespace) (Interface, error) {
	h, err := n.handle()
	if err != nil {
		return Interface{}, err
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return Interface{}, fmt.Errorf("list links in %s: %w", n.path, err)
	}
	routes, err := h.RouteList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return Interface{}, fmt.Errorf("list routes in %s: %w", n.path, err)
	}
	addrs, err := globalAddrs(h)
	if err != nil {
		return Interface{}, fmt.Errorf("list addresses in %s: %w", n.path, err)
	}
	link, err := pick(links, routes, addrs)
	if err != nil {
		return Interface{}, fmt.Errorf("discover interface in %s: %w", n.path, err)
	}
	a := link.Attrs()
	iface := Interface{Name: a.Name, Index: a.Index, MAC: a.HardwareAddr, MTU: a.MTU, Addrs: addrs[a.Index]}
	if iface.Routes, err = routesOf(a, routes); err != nil {
		return Interface{}, fmt.Errorf("discover interface in %s: %w", n.path, err)
	}
	return iface, nil
}

// pick chooses the interface: the default route's, else the only one with
// a global address.
func pick(links []netlink.Link, routes []netlink.Route, addrs map[int][]net.IPNet) (netlink.Link, error) {
	byIndex := map[int]netlink.Link{}
	for _, l := range links {
		byIndex[l.Attrs().Index] = l
	}
	var withDefault []netlink.Link
	for _, r := range routes {
		if l, ok := byIndex[r.LinkIndex]; ok && r.Type == unix.RTN_UNICAST && isDefault(r.Dst) && !contains(withDefault, l) {
			withDefault = append(withDefault, l)
		}
	}
	switch len(withDefault) {
	case 1:
		return withDefault[0], nil
	case 0:
	default:
		return nil, fmt.Errorf("default routes on several interfaces (%s); want exactly one", describe(withDefault, addrs))
	}
	var withAddr []netlink.Link
	for _, l := range links {
		if l.Attrs().Flags&net.FlagLoopback == 0 && len(addrs[l.Attrs().Index]) > 0 {
			withAddr = append(withAddr, l)
		}
	}
	switch len(withAddr) {
	case 1:
		return withAddr[0], nil
	case 0:
		return nil, fmt.Errorf("%w: no default route and no interface with a global address (links: %s)", ErrNoInterface, describe(links, addrs))
	default:
		return nil, fmt.Errorf("no default route and several interfaces with addresses (%s); want exactly one", describe(withAddr, addrs))
	}
}

// globalAddrs are the addresses of global scope, IPv6 link-local excluded,
// by link index. One dump serves every link: netlink's AddrList dumps all
// addresses whatever link it is given, and filters them after.
func globalAddrs(h *netlink.Handle) (map[int][]net.IPNet, error) {
	list, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	out := map[int][]net.IPNet{}
	for _, a := range list {
		if a.Scope == unix.RT_SCOPE_UNIVERSE && !a.IP.IsLinkLocalUnicast() {
			out[a.LinkIndex] = append(out[a.LinkIndex], *a.IPNet)
		}
	}
	return out, nil
}

// routesOf converts the non-kernel routes through a into Routes.
func routesOf(a *netlink.LinkAttrs, routes []netlink.Route) ([]Route, error) {
	var out []Route
	for _, r := range routes {
		if multipathVia(r, a.Index) {
			return nil, fmt.Errorf("route %s via %s has several next hops; a VM's single NIC cannot carry it", dstString(r.Dst), a.Name)
		}
		if r.LinkIndex != a.Index || r.Protocol == unix.RTPROT_KERNEL || r.Type != unix.RTN_UNICAST {
			continue
		}
		out = append(out, Route{
			Dst:    routeDst(r),
			Gw:     r.Gw,
			Src:    r.Src,
			Metric: r.Priority,
			OnLink: r.Flags&unix.RTNH_F_ONLINK != 0,
		})
	}
	return out, nil
}

func multipathVia(r netlink.Route, index int) bool {
	for _, nh := range r.MultiPath {
		if nh.LinkIndex == index {
			return true
		}
	}
	return false
}

// routeDst is r's destination, a default one spelled 0/0 of r's family:
// netlink reports it so, but a route without RTA_DST has none.
func routeDst(r netlink.Route) *net.IPNet {
	if r.Dst != nil {
		return r.Dst
	}
	if r.Family == unix.AF_INET6 {
		return &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
	}
	return &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
}

func isDefault(d *net.IPNet) bool {
	if d == nil {
		return true
	}
	ones, _ := d.Mask.Size()
	return ones == 0 && d.IP.IsUnspecified()
}

func dstString(d *net.IPNet) string {
	if isDefault(d) {
		return "default"
	}
	return d.String()
}

func contains(links []netlink.Link, l netlink.Link) bool {
	for _, x := range links {
		if x.Attrs().Index == l.Attrs().Index {
			return true
		}
	}
	return false
}

// describe lists links with their global addresses, for errors.
func describe(links []netlink.Link, addrs map[int][]net.IPNet) string {
	if len(links) == 0 {
		return "none"
	}
	var parts []string
	for _, l := range links {
		var as []string
		for _, a := range addrs[l.Attrs().Index] {
			as = append(as, a.String())
		}
		sort.Strings(as)
		if len(as) == 0 {
			as = []string{"no global address"}
		}
		parts = append(parts, fmt.Sprintf("%s [%s]", l.Attrs().Name, strings.Join(as, " ")))
	}
	return strings.Join(parts, ", ")
}
