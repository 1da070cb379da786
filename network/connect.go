package network

import (
	"errors"
	"fmt"
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ErrInUse is wrapped by Connect's error when another VM's tap, still
// present, already takes the interface's traffic.
var ErrInUse = errors.New("network interface in use by another VM")

// errNotNetNS marks a path that opens but is not a network namespace.
var errNotNetNS = errors.New("not a network namespace (want an nsfs file of type net, such as /proc/PID/ns/net or a bind mount of one)")

// ingressParent is the parent of filters on an ingress qdisc ("ffff:").
var ingressParent = netlink.MakeHandle(0xffff, 0)

// Connect joins tap and iface with tc: an ingress qdisc on each and a
// match-all u32 filter whose mirred action redirects every frame to the
// other's egress, both ways (no bridge, no MAC learning). It then brings
// the tap up with iface's MTU. A redirect on iface to a tap that still
// exists fails with ErrInUse naming it; one to a tap that is gone (a
// crashed VM) is replaced, and so is one to tap itself.
func Connect(n *Namespace, iface Interface, tap *Tap) error {
	err := n.locked(func(h *netlink.Handle) error { return connect(h, iface, tap) })
	if err != nil {
		return fmt.Errorf("connect %s to tap %s in %s: %w", iface.Name, tap.Name, n.path, err)
	}
	return nil
}

func connect(h *netlink.Handle, iface Interface, tap *Tap) error {
	link, err := linkByIndex(h, iface.Index, iface.Name)
	if err != nil {
		return err
	}
	tapLink, err := linkByIndex(h, tap.Index, tap.Name)
	if err != nil {
		return err
	}
	if err := takeOver(h, link, tap.Index); err != nil {
		return err
	}
	mtu := iface.MTU
	if mtu == 0 {
		mtu = link.Attrs().MTU
	}
	if err := h.LinkSetMTU(tapLink, mtu); err != nil {
		return fmt.Errorf("set tap mtu %d: %w", mtu, err)
	}
	if err := redirect(h, tapLink, link); err != nil {
		return err
	}
	if err := redirect(h, link, tapLink); err != nil {
		return err
	}
	if err := h.LinkSetUp(tapLink); err != nil {
		// The iface redirect would otherwise drop its traffic into a
		// down tap until someone released it.
		return errors.Join(fmt.Errorf("set tap up: %w", err), unredirect(h, link, tap.Index))
	}
	return nil
}

// takeOver checks that link's ingress redirects only to taps that are
// gone (or to own), and removes those.
func takeOver(h *netlink.Handle, link netlink.Link, own int) error {
	filters, err := redirects(h, link)
	if err != nil {
		return err
	}
	var stale []netlink.Filter
	for _, f := range filters {
		target := redirectTarget(f)
		if target == own {
			stale = append(stale, f)
			continue
		}
		other, err := existingLink(h, target)
		if err != nil {
			return err
		}
		if other != nil {
			return fmt.Errorf("%s already redirects to %s (index %d): %w", link.Attrs().Name, other.Attrs().Name, target, ErrInUse)
		}
		stale = append(stale, f)
	}
	return deleteFilters(h, stale)
}

// redirect adds an ingress qdisc to from (unless it has one) and a u32
// match-all filter redirecting all its ingress to to's egress.
func redirect(h *netlink.Handle, from, to netlink.Link) error {
	qdisc := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{
		LinkIndex: from.Attrs().Index,
		Parent:    netlink.HANDLE_INGRESS,
		Handle:    ingressParent,
	}}
	if err := h.QdiscAdd(qdisc); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add ingress qdisc to %s: %w", from.Attrs().Name, err)
	}
	filter := &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: from.Attrs().Index,
			Parent:    ingressParent,
			Protocol:  unix.ETH_P_ALL,
		},
		// A nil selector is a single zero key: every frame matches.
		Actions: []netlink.Action{netlink.NewMirredAction(to.Attrs().Index)},
	}
	if err := h.FilterAdd(filter); err != nil {
		return fmt.Errorf("redirect %s to %s: %w", from.Attrs().Name, to.Attrs().Name, err)
	}
	return nil
}

// Release deletes the tap tapName and undoes Connect: the redirects to it
// on ifaceName, or on any link when ifaceName is "". It is idempotent and
// tolerant of anything already gone: the namespace (or a path that no
// longer names one), the interface, the tap, the filters. It needs only
// names, so it works from what a crashed shim left on disk.
func Release(nsPath, ifaceName, tapName string) error {
	n, err := Open(nsPath)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, errNotNetNS) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("release tap %s: %w", tapName, err)
	}
	defer n.Close()
	return n.ReleaseTap(ifaceName, tapName)
}

// ReleaseTap is Release inside n, which the caller holds open: it acts on
// the namespace even once nothing names it any more (its bind mount gone),
// which the path-based Release would take for a namespace already gone.
func (n *Namespace) ReleaseTap(ifaceName, tapName string) error {
	err := n.locked(func(h *netlink.Handle) error { return release(h, ifaceName, tapName) })
	if err != nil {
		return fmt.Errorf("release tap %s from %s in %s: %w", tapName, ifaceName, n.path, err)
	}
	return nil
}

func release(h *netlink.Handle, ifaceName, tapName string) error {
	tap, err := existingLinkByName(h, tapName)
	if err != nil {
		return err
	}
	if tap != nil && tap.Type() != "tuntap" {
		return fmt.Errorf("link %s is a %s, not a tap: not deleting it", tapName, tap.Type())
	}
	// Deleted first, the tap leaves redirects to a gone link behind, which
	// unredirect removes wherever they are.
	if tap != nil {
		if err := h.LinkDel(tap); err != nil && !isNotFound(err) {
			return fmt.Errorf("delete tap: %w", err)
		}
	}
	links, err := sweep(h, ifaceName)
	if err != nil {
		return err
	}
	for _, l := range links {
		if err := unredirect(h, l, 0); err != nil {
			return err
		}
	}
	return nil
}

// sweep lists the links whose redirects release checks: the named
// interface, or every link when the name is unknown (a crashed shim
// records only the tap).
func sweep(h *netlink.Handle, ifaceName string) ([]netlink.Link, error) {
	if ifaceName == "" {
		links, err := h.LinkList()
		if err != nil {
			return nil, fmt.Errorf("list links: %w", err)
		}
		return links, nil
	}
	l, err := existingLinkByName(h, ifaceName)
	if err != nil || l == nil {
		return nil, err
	}
	return []netlink.Link{l}, nil
}

// unredirect removes link's redirects to tapIndex and to links that are
// gone, then its ingress qdisc if no filter is left on it.
func unredirect(h *netlink.Handle, link netlink.Link, tapIndex int) error {
	filters, err := redirects(h, link)
	if err != nil {
		return err
	}
	var ours []netlink.Filter
	for _, f := range filters {
		target := redirectTarget(f)
		other, err := existingLink(h, target)
		if err != nil {
			return err
		}
		if (tapIndex != 0 && target == tapIndex) || other == nil {
			ours = append(ours, f)
		}
	}
	if len(ours) == 0 {
		return nil // not ours to touch, nor its qdisc
	}
	if err := deleteFilters(h, ours); err != nil {
		return err
	}
	left, err := h.FilterList(link, ingressParent)
	if err != nil {
		return fmt.Errorf("list filters of %s: %w", link.Attrs().Name, err)
	}
	if len(left) > 0 {
		return nil
	}
	qdisc := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{
		LinkIndex: link.Attrs().Index,
		Parent:    netlink.HANDLE_INGRESS,
		Handle:    ingressParent,
	}}
	if err := h.QdiscDel(qdisc); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("delete ingress qdisc of %s: %w", link.Attrs().Name, err)
	}
	return nil
}

// redirects lists link's ingress filters that redirect to another link.
func redirects(h *netlink.Handle, link netlink.Link) ([]netlink.Filter, error) {
	filters, err := h.FilterList(link, ingressParent)
	if err != nil {
		return nil, fmt.Errorf("list filters of %s: %w", link.Attrs().Name, err)
	}
	var out []netlink.Filter
	for _, f := range filters {
		if redirectTarget(f) >= 0 {
			out = append(out, f)
		}
	}
	return out, nil
}

// redirectTarget is the ifindex a u32 filter's mirred action redirects to
// (0 when that link was deleted), or -1 if f redirects nowhere.
func redirectTarget(f netlink.Filter) int {
	u, ok := f.(*netlink.U32)
	if !ok {
		return -1
	}
	for _, a := range u.Actions {
		if m, ok := a.(*netlink.MirredAction); ok && m.MirredAction == netlink.TCA_EGRESS_REDIR {
			return m.Ifindex
		}
	}
	return -1
}

// deleteFilters deletes each filter's whole u32 instance (its priority and
// protocol), hash table included, so nothing empty is left behind.
func deleteFilters(h *netlink.Handle, filters []netlink.Filter) error {
	for _, f := range filters {
		a := f.Attrs()
		del := &netlink.U32{FilterAttrs: netlink.FilterAttrs{
			LinkIndex: a.LinkIndex,
			Parent:    a.Parent,
			Priority:  a.Priority,
			Protocol:  a.Protocol,
		}}
		if err := h.FilterDel(del); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("delete filter (priority %d) of link %d: %w", a.Priority, a.LinkIndex, err)
		}
	}
	return nil
}

// linkByIndex finds the link index and checks it is still called name.
func linkByIndex(h *netlink.Handle, index int, name string) (netlink.Link, error) {
	l, err := h.LinkByIndex(index)
	if err != nil {
		return nil, fmt.Errorf("find %s (index %d): %w", name, index, err)
	}
	if l.Attrs().Name != name {
		return nil, fmt.Errorf("find %s: index %d is now %s", name, index, l.Attrs().Name)
	}
	return l, nil
}

// existingLink is the link index, or nil if there is none.
func existingLink(h *netlink.Handle, index int) (netlink.Link, error) {
	if index <= 0 {
		return nil, nil
	}
	l, err := h.LinkByIndex(index)
	if isNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("find link %d: %w", index, err)
	}
	return l, nil
}

// existingLinkByName is the link name, or nil if there is none.
func existingLinkByName(h *netlink.Handle, name string) (netlink.Link, error) {
	l, err := h.LinkByName(name)
	if isNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("find link %s: %w", name, err)
	}
	return l, nil
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}
