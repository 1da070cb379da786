package network

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// AdoptTap moves t, a tap in from that a running hypervisor holds a queue
// of, into n under the name of n's tap replaced (deleted once t is
// there), as CreateTap would have made it: down and without IPv6
// addresses. A VM restored ahead in a namespace of its own so takes a
// task's namespace (CNI's, a pod's) without a new NIC: the queue follows
// its device. Until t has moved nothing has changed; after, a failure
// deletes it. The tap returned has t's queue, if t still had one.
func (n *Namespace) AdoptTap(from *Namespace, t *Tap, replaced string) (*Tap, error) {
	if err := checkLinkName(replaced); err != nil {
		return nil, err
	}
	if err := from.locked(func(h *netlink.Handle) error { return moveTap(h, t, n) }); err != nil {
		return nil, fmt.Errorf("move tap %s from %s into %s: %w", t.Name, from.path, n.path, err)
	}
	var adopted *Tap
	err := n.locked(func(h *netlink.Handle) error {
		l, err := h.LinkByName(t.Name)
		if err != nil {
			return fmt.Errorf("find the moved tap: %w", err)
		}
		if err := renameTap(h, l, replaced); err != nil {
			return errors.Join(err, deleteTap(h, t.Name))
		}
		adopted = &Tap{Name: replaced, Index: l.Attrs().Index, File: t.File}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("adopt tap %s in %s as %s: %w", t.Name, n.path, replaced, err)
	}
	return adopted, nil
}

// renameTap deletes the tap name and gives l its name, with IPv6 address
// generation off again: the move reset the device's IPv6 settings to its
// new namespace's defaults.
func renameTap(h *netlink.Handle, l netlink.Link, name string) error {
	if err := deleteTap(h, name); err != nil {
		return err
	}
	if err := h.LinkSetName(l, name); err != nil {
		return fmt.Errorf("rename: %w", err)
	}
	if err := h.LinkSetIP6AddrGenMode(l, nl.IN6_ADDR_GEN_MODE_NONE); err != nil && !errors.Is(err, unix.EAFNOSUPPORT) {
		return fmt.Errorf("turn off IPv6 address generation: %w", err)
	}
	return nil
}

// deleteTap deletes the tap name, if there is one; a link of another
// kind by that name is left, and an error.
func deleteTap(h *netlink.Handle, name string) error {
	l, err := existingLinkByName(h, name)
	if err != nil || l == nil {
		return err
	}
	if l.Type() != "tuntap" {
		return fmt.Errorf("link %s is a %s, not a tap: not deleting it", name, l.Type())
	}
	if err := h.LinkDel(l); err != nil && !isNotFound(err) {
		return fmt.Errorf("delete tap %s: %w", name, err)
	}
	return nil
}

// moveTap takes t down and moves it into to.
func moveTap(h *netlink.Handle, t *Tap, to *Namespace) error {
	l, err := linkByIndex(h, t.Index, t.Name)
	if err != nil {
		return err
	}
	if l.Type() != "tuntap" {
		return fmt.Errorf("link %s is a %s, not a tap", t.Name, l.Type())
	}
	if err := h.LinkSetDown(l); err != nil {
		return fmt.Errorf("set it down: %w", err)
	}
	return h.LinkSetNsFd(l, int(to.f.Fd()))
}
