package server

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// virtioNet is the driver of the guest's NIC, as ethtool names it.
const virtioNet = "virtio_net"

// dumpRetries bounds retries of a netlink dump the kernel interrupted
// because the table changed under it.
const dumpRetries = 5

// Netlink configures the guest's NIC with netlink, in the network namespace
// of the calling thread. The NIC is found by its driver, never by name.
type Netlink struct {
	// Driver is the NIC's driver as ethtool names it; empty means
	// virtio_net.
	Driver string
}

// Configure sets the NIC down, flushes its addresses and routes, then, for
// a cfg, sets its MAC and MTU, brings it up and adds the addresses and the
// routes, on-link ones first so the gateways of the others resolve.
func (n Netlink) Configure(cfg *NetConfig) error {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("open netlink: %w", err)
	}
	defer h.Close()
	link, err := n.find(h)
	if errors.Is(err, errdefs.ErrNotFound) && cfg == nil {
		return nil // no NIC, nothing to take down
	}
	if err != nil {
		return err
	}
	name := link.Attrs().Name
	if link.Attrs().Flags&net.FlagUp != 0 {
		if err := h.LinkSetDown(link); err != nil {
			return fmt.Errorf("set %s down: %w", name, err)
		}
	}
	if err := flush(h, link); err != nil {
		return err
	}
	if cfg == nil {
		return nil
	}
	if err := setIdentity(h, link, cfg); err != nil {
		return err
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up: %w", name, err)
	}
	return addAddressesAndRoutes(h, link, cfg)
}

// find returns the one non-loopback link whose driver is n.Driver.
func (n Netlink) find(h *netlink.Handle) (netlink.Link, error) {
	driver := n.Driver
	if driver == "" {
		driver = virtioNet
	}
	links, err := dump(h.LinkList)
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open ethtool socket: %w", err)
	}
	defer unix.Close(fd)
	var found []netlink.Link
	var names []string
	for _, l := range links {
		if l.Attrs().Flags&net.FlagLoopback != 0 {
			continue
		}
		info, err := unix.IoctlGetEthtoolDrvinfo(fd, l.Attrs().Name)
		if err != nil {
			continue // a link without a driver to report is no NIC
		}
		if unix.ByteSliceToString(info.Driver[:]) == driver {
			found = append(found, l)
			names = append(names, l.Attrs().Name)
		}
	}
	switch len(found) {
	case 0:
		return nil, fmt.Errorf("no %s interface in the guest: %w", driver, errdefs.ErrNotFound)
	case 1:
		return found[0], nil
	}
	return nil, fmt.Errorf("%d %s interfaces in the guest (%s), expected one: %w",
		len(found), driver, strings.Join(names, ", "), errdefs.ErrFailedPrecondition)
}

// flush removes every address of link and every route through it.
func flush(h *netlink.Handle, link netlink.Link) error {
	name := link.Attrs().Name
	addrs, err := dump(func() ([]netlink.Addr, error) { return h.AddrList(link, netlink.FAMILY_ALL) })
	if err != nil {
		return fmt.Errorf("list addresses of %s: %w", name, err)
	}
	for _, a := range addrs {
		if err := h.AddrDel(link, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("remove address %s from %s: %w", a.IPNet, name, err)
		}
	}
	filter := &netlink.Route{LinkIndex: link.Attrs().Index, Table: unix.RT_TABLE_MAIN}
	routes, err := dump(func() ([]netlink.Route, error) {
		return h.RouteListFiltered(netlink.FAMILY_ALL, filter, netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return fmt.Errorf("list routes of %s: %w", name, err)
	}
	for _, r := range routes {
		if err := h.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("remove route %s from %s: %w", r, name, err)
		}
	}
	return nil
}

func setIdentity(h *netlink.Handle, link netlink.Link, cfg *NetConfig) error {
	name := link.Attrs().Name
	if cfg.MAC != nil {
		if err := h.LinkSetHardwareAddr(link, cfg.MAC); err != nil {
			return fmt.Errorf("set the MAC of %s to %s: %w", name, cfg.MAC, err)
		}
	}
	if cfg.MTU != 0 {
		if err := h.LinkSetMTU(link, cfg.MTU); err != nil {
			return fmt.Errorf("set the MTU of %s to %d: %w", name, cfg.MTU, err)
		}
	}
	return nil
}

func addAddressesAndRoutes(h *netlink.Handle, link netlink.Link, cfg *NetConfig) error {
	name := link.Attrs().Name
	for _, a := range cfg.Addresses {
		addr := &netlink.Addr{IPNet: a}
		if !isIPv4(a.IP) {
			// The host checked the address is the pod's; a tentative one
			// could not be a route's source for a second or so.
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := h.AddrAdd(link, addr); err != nil {
			return fmt.Errorf("add address %s to %s: %w", a, name, err)
		}
	}
	routes := slices.Clone(cfg.Routes)
	slices.SortStableFunc(routes, func(a, b NetRoute) int {
		return boolInt(a.Gateway != nil) - boolInt(b.Gateway != nil)
	})
	for _, r := range routes {
		route := netlink.Route{
			LinkIndex: link.Attrs().Index, Dst: r.Dst, Gw: r.Gateway, Src: r.Source, Priority: r.Metric,
		}
		if r.Gateway == nil {
			route.Scope = netlink.SCOPE_LINK
		}
		if r.OnLink {
			route.Flags = int(netlink.FLAG_ONLINK)
		}
		if err := h.RouteAdd(&route); err != nil {
			return fmt.Errorf("add route %s to %s: %w", route, name, err)
		}
	}
	return nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// dump retries a netlink dump the kernel interrupted.
func dump[T any](list func() ([]T, error)) ([]T, error) {
	for i := 0; ; i++ {
		out, err := list()
		if !errors.Is(err, netlink.ErrDumpInterrupted) || i == dumpRetries {
			return out, err
		}
	}
}
