package network

import (
	"net"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestCreateTap: a persistent IFF_TAP|IFF_NO_PI tap without vnet header,
// with the asked MTU, down, that never grows an IPv6 link-local address,
// and that outlives its queue.
func TestCreateTap(t *testing.T) {
	n := newNS(t)
	tap, err := CreateTap(n, uniqueTapName(t), 1300)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := Release(n.Path(), "eth0", tap.Name); err != nil {
			t.Error(err)
		}
	})
	if _, err := CreateTap(n, tap.Name, 0); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("second CreateTap of %s: %v, want an error saying it exists", tap.Name, err)
	}
	inNS(t, n, func(h *netlink.Handle) error {
		l, err := h.LinkByIndex(tap.Index)
		if err != nil {
			return err
		}
		tt, ok := l.(*netlink.Tuntap)
		if !ok || l.Attrs().Name != tap.Name {
			t.Fatalf("link %d is %s (%s), want tap %s", tap.Index, l.Attrs().Name, l.Type(), tap.Name)
		}
		if tt.Mode != netlink.TUNTAP_MODE_TAP || tt.Flags&netlink.TUNTAP_NO_PI == 0 || tt.Flags&netlink.TUNTAP_VNET_HDR != 0 || tt.NonPersist {
			t.Errorf("tap mode %v flags %#x nonpersist %v; want tap, no_pi, no vnet_hdr, persistent", tt.Mode, tt.Flags, tt.NonPersist)
		}
		if l.Attrs().MTU != 1300 || l.Attrs().Flags&net.FlagUp != 0 {
			t.Errorf("tap mtu %d flags %v, want 1300 and down", l.Attrs().MTU, l.Attrs().Flags)
		}
		// Up with its queue open, so it has carrier: the point where IPv6
		// would add a link-local address.
		if err := h.LinkSetUp(l); err != nil {
			return err
		}
		addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
		if len(addrs) != 0 {
			t.Errorf("tap addresses %v, want none", addrs)
		}
		return err
	})
	if err := tap.File.Close(); err != nil {
		t.Fatal(err)
	}
	inNS(t, n, func(h *netlink.Handle) error {
		_, err := h.LinkByIndex(tap.Index)
		return err // not persistent: gone with its only queue
	})
}

// TestCreateTapNames: names the kernel would refuse or treat as a
// template are rejected before anything is created.
func TestCreateTapNames(t *testing.T) {
	n := newNS(t)
	for _, name := range []string{"", "ctap0123456789ab", "tap%d", "a/b", "a b", "a:b"} {
		if _, err := CreateTap(n, name, 0); err == nil || !strings.Contains(err.Error(), "invalid tap name") {
			t.Errorf("CreateTap(%q) = %v, want an invalid name error", name, err)
		}
	}
}

// TestTapName: deterministic, distinct per task, a valid link name.
func TestTapName(t *testing.T) {
	a, b := TapName("task-a"), TapName("task-b")
	if a != TapName("task-a") || a == b {
		t.Errorf("TapName: %s, %s; want stable and distinct", a, b)
	}
	for _, name := range []string{a, b, TapName(strings.Repeat("x", 300))} {
		if err := checkLinkName(name); err != nil || len(name) != unix.IFNAMSIZ-1 {
			t.Errorf("TapName gave %q (%d chars): %v", name, len(name), err)
		}
	}
}
