package network

import (
	"net"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
)

// TestAdoptTap: a tap with an open queue moves from its namespace into
// another, replacing the tap made there, under that tap's name, down,
// without IPv6 addresses once up, and its queue still its own: a frame
// written to it arrives on the moved link. A link of another kind by the
// name is not replaced.
func TestAdoptTap(t *testing.T) {
	from, to := newNS(t), newNS(t)
	pooled, err := CreateTap(from, uniqueTapName(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pooled.File.Close() })
	replaced := testTap(t, to, "")
	replaced.File.Close()

	tap, err := to.AdoptTap(from, pooled, replaced.Name)
	if err != nil {
		t.Fatal(err)
	}
	if tap.Name != replaced.Name || tap.File != pooled.File {
		t.Errorf("adopted tap %s with queue %v, want %s with the pooled tap's queue", tap.Name, tap.File, replaced.Name)
	}
	inNS(t, from, func(h *netlink.Handle) error {
		if l, err := existingLink(h, pooled.Index); l != nil || err != nil {
			t.Errorf("the pooled namespace still has link %d (%v)", pooled.Index, err)
		}
		return nil
	})
	inNS(t, to, func(h *netlink.Handle) error {
		l, err := h.LinkByIndex(tap.Index)
		if err != nil {
			return err
		}
		if l.Attrs().Name != replaced.Name || l.Type() != "tuntap" || l.Attrs().Flags&net.FlagUp != 0 {
			t.Errorf("link %d is %s (%s, flags %v), want tap %s, down", tap.Index, l.Attrs().Name, l.Type(), l.Attrs().Flags, replaced.Name)
		}
		if err := h.LinkSetUp(l); err != nil {
			return err
		}
		if addrs, err := h.AddrList(l, netlink.FAMILY_ALL); err != nil || len(addrs) != 0 {
			t.Errorf("adopted tap addresses %v (%v), want none", addrs, err)
		}
		frame := append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0, 0, 0, 0, 1, 0x88, 0xb5}, make([]byte, 46)...)
		if _, err := tap.File.Write(frame); err != nil {
			t.Errorf("write a frame to the adopted queue: %v", err)
		}
		if l, err = h.LinkByIndex(tap.Index); err != nil {
			return err
		}
		if got := l.Attrs().Statistics.RxPackets; got != 1 {
			t.Errorf("the adopted link received %d frames from its queue, want 1", got)
		}
		return nil
	})

}

// TestAdoptTapOverOther: a link of another kind by the replaced name
// stays, and so does nothing of the tap that moved for it.
func TestAdoptTapOverOther(t *testing.T) {
	from, to := newNS(t), newNS(t)
	pooled, err := CreateTap(from, uniqueTapName(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pooled.File.Close() })
	veth := addVeth(t, to, "keep0", 0, from, "peer0")
	if _, err := to.AdoptTap(from, pooled, veth.Attrs().Name); err == nil || !strings.Contains(err.Error(), "not a tap") {
		t.Errorf("AdoptTap over a veth: %v, want it refused as not a tap", err)
	}
	inNS(t, to, func(h *netlink.Handle) error {
		links, err := h.LinkList()
		for _, l := range links {
			if l.Attrs().Name != "lo" && l.Attrs().Name != "keep0" {
				t.Errorf("link %s (%s) left in the namespace", l.Attrs().Name, l.Type())
			}
		}
		return err
	})
}
