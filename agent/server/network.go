package server

import (
	"fmt"
	"net"

	"github.com/containerd/errdefs"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// Network configures the guest's NIC; tests replace it so they never touch
// the host's interfaces.
type Network interface {
	// Configure gives the NIC cfg; nil sets it down with no addresses or
	// routes. The NIC is down while its identity changes, so it never
	// answers with the old one.
	Configure(cfg *NetConfig) error
}

// NetConfig is a checked api.Network.
type NetConfig struct {
	MAC       net.HardwareAddr // nil keeps the NIC's
	MTU       int              // 0 keeps the NIC's
	Addresses []*net.IPNet     // IP is the address, Mask its prefix
	Routes    []NetRoute
}

// NetRoute is a checked api.Route.
type NetRoute struct {
	Dst     *net.IPNet // nil: the default route of Gateway's family
	Gateway net.IP     // nil: on-link
	Source  net.IP
	Metric  int
	OnLink  bool
}

// parseNetwork checks n: each error says which value was wrong and what was
// expected.
func parseNetwork(n *api.Network) (*NetConfig, error) {
	cfg := &NetConfig{MTU: int(n.Mtu)}
	if n.Mtu != 0 && (n.Mtu < 68 || n.Mtu > 65535) {
		return nil, fmt.Errorf("mtu %d: expected 68..65535: %w", n.Mtu, errdefs.ErrInvalidArgument)
	}
	if n.Mac != "" {
		mac, err := net.ParseMAC(n.Mac)
		if err != nil || len(mac) != 6 || mac[0]&1 != 0 {
			return nil, fmt.Errorf("mac %q: expected a unicast Ethernet address: %w", n.Mac, errdefs.ErrInvalidArgument)
		}
		cfg.MAC = mac
	}
	for _, a := range n.Addresses {
		ip, ipnet, err := net.ParseCIDR(a)
		if err != nil {
			return nil, fmt.Errorf("address %q: expected a CIDR such as 10.0.0.2/24: %w", a, errdefs.ErrInvalidArgument)
		}
		cfg.Addresses = append(cfg.Addresses, &net.IPNet{IP: ip, Mask: ipnet.Mask})
	}
	for _, r := range n.Routes {
		route, err := parseRoute(r)
		if err != nil {
			return nil, err
		}
		cfg.Routes = append(cfg.Routes, route)
	}
	return cfg, nil
}

func parseRoute(r *api.Route) (NetRoute, error) {
	bad := func(what string) (NetRoute, error) {
		return NetRoute{}, fmt.Errorf("route to %q via %q: %s: %w", r.Destination, r.Gateway, what, errdefs.ErrInvalidArgument)
	}
	route := NetRoute{Metric: int(r.Metric), OnLink: r.OnLink}
	if r.Destination != "" {
		_, dst, err := net.ParseCIDR(r.Destination)
		if err != nil {
			return bad("expected the destination as a CIDR, or empty for the default route")
		}
		route.Dst = dst
	}
	if r.Gateway != "" {
		if route.Gateway = net.ParseIP(r.Gateway); route.Gateway == nil {
			return bad("expected the gateway as an IP address, or empty for an on-link route")
		}
	}
	if r.Source != "" {
		if route.Source = net.ParseIP(r.Source); route.Source == nil {
			return bad(fmt.Sprintf("source %q: expected an IP address", r.Source))
		}
	}
	switch {
	case route.Dst == nil && route.Gateway == nil:
		return bad("a default route needs a gateway")
	case route.Dst != nil && route.Gateway != nil && isIPv4(route.Dst.IP) != isIPv4(route.Gateway):
		return bad("destination and gateway are of different families")
	case route.OnLink && route.Gateway == nil:
		return bad("on_link needs a gateway")
	}
	return route, nil
}

func isIPv4(ip net.IP) bool { return ip.To4() != nil }
