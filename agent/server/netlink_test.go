package server

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// enterNewNetns moves the calling test's thread into a new, empty network
// namespace for the rest of the test. The thread stays locked, so it exits
// with the test and takes the namespace with it: nothing touches the
// host's interfaces and nothing is left behind.
func enterNewNetns(t testing.TB) {
	t.Helper()
	testenv.RequireRoot(t)
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		t.Fatalf("unshare the network namespace: %v", err)
	}
}

func uniqueName(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// nicDriver is the driver of the guest NIC's stand-in, a tap (the test
// machines' kernels have no dummy links).
const nicDriver = "tun"

// addNIC makes a tap, the guest NIC's stand-in, up with an old identity: a
// MAC, an address and a route, as a restored snapshot has.
func addNIC(t testing.TB, mac string) netlink.Link {
	t.Helper()
	name := uniqueName("nic")
	if err := netlink.LinkAdd(&netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: name}, Mode: netlink.TUNTAP_MODE_TAP}); err != nil {
		t.Fatalf("add tap: %v", err)
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	hw, _ := net.ParseMAC(mac)
	if err := netlink.LinkSetHardwareAddr(l, hw); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
	old := &netlink.Addr{IPNet: mustCIDR(t, "192.168.7.7/24")}
	if err := netlink.AddrAdd(l, old); err != nil {
		t.Fatal(err)
	}
	dst := &net.IPNet{IP: net.IPv4(172, 16, hw[5], 0).To4(), Mask: net.CIDRMask(24, 32)}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst, Gw: net.ParseIP("192.168.7.1")}); err != nil {
		t.Fatal(err)
	}
	return l
}

func mustCIDR(t testing.TB, s string) *net.IPNet {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		t.Fatal(err)
	}
	return &net.IPNet{IP: ip, Mask: n.Mask}
}

// watchLink records the link's (up, MAC) at every change; until returns
// what it recorded up to the first want, failing the test if want does not
// come within watchTimeout.
func watchLink(t *testing.T, index int) (until func(want string) []string) {
	t.Helper()
	updates, done := make(chan netlink.LinkUpdate, 256), make(chan struct{})
	if err := netlink.LinkSubscribe(updates, done); err != nil {
		t.Fatal(err)
	}
	// Closing done ends the subscription, which then closes updates.
	stop := sync.OnceFunc(func() {
		close(done)
		for range updates {
		}
	})
	t.Cleanup(stop)
	return func(want string) []string {
		t.Helper()
		defer stop()
		timeout := time.NewTimer(watchTimeout)
		defer timeout.Stop()
		var seen []string
		for {
			select {
			case u, ok := <-updates:
				if !ok {
					t.Fatalf("link updates ended before %q: %v", want, seen)
				}
				if u.Attrs().Index != index {
					continue
				}
				up := u.Attrs().Flags&net.FlagUp != 0
				seen = append(seen, map[bool]string{true: "up ", false: "down "}[up]+u.Attrs().HardwareAddr.String())
				if seen[len(seen)-1] == want {
					return seen
				}
			case <-timeout.C:
				t.Fatalf("no link update %q within %s: %v", want, watchTimeout, seen)
			}
		}
	}
}

// watchTimeout bounds the wait for a link update Configure caused.
const watchTimeout = 10 * time.Second

var testNetConfig = &NetConfig{
	MAC: net.HardwareAddr{0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0xee}, MTU: 1400,
	Addresses: []*net.IPNet{{IP: net.ParseIP("10.88.0.4"), Mask: net.CIDRMask(16, 32)}, {IP: net.ParseIP("fd00::4"), Mask: net.CIDRMask(64, 128)}},
	Routes: []NetRoute{
		// Listed gateways first: Configure adds on-link routes first.
		{Gateway: net.ParseIP("10.99.0.1"), Metric: 100},
		{Gateway: net.ParseIP("fd00::1")},
		{Dst: &net.IPNet{IP: net.ParseIP("10.77.0.0").To4(), Mask: net.CIDRMask(16, 32)}, Gateway: net.ParseIP("192.168.0.1"), OnLink: true},
		{Dst: &net.IPNet{IP: net.ParseIP("10.99.0.0").To4(), Mask: net.CIDRMask(16, 32)}, Source: net.ParseIP("10.88.0.4")},
	},
}

// TestNetlinkConfigure runs the real netlink code on a tap in a new
// network namespace: the old identity is gone, the new one complete, and
// the link was never up with the old MAC while it changed.
func TestNetlinkConfigure(t *testing.T) {
	enterNewNetns(t)
	const oldMAC = "02:00:00:00:00:99"
	link := addNIC(t, oldMAC)
	decoy := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: uniqueName("vx")}, PeerName: uniqueName("vy")}
	if err := netlink.LinkAdd(decoy); err != nil {
		t.Fatal(err)
	}
	until := watchLink(t, link.Attrs().Index)
	if err := (Netlink{Driver: nicDriver}).Configure(testNetConfig); err != nil {
		t.Fatal(err)
	}
	// A tap takes a new MAC while up, so only a down before the first up
	// with the new MAC shows that Configure took the link down first.
	seen := until("up " + testNetConfig.MAC.String())
	if !slices.ContainsFunc(seen, func(e string) bool { return strings.HasPrefix(e, "down ") }) {
		t.Errorf("the link was not down before it was up with the new MAC: %v", seen)
	}
	for _, e := range seen {
		if strings.HasPrefix(e, "up ") && strings.HasSuffix(e, oldMAC) {
			t.Errorf("the link was up with the old MAC during Configure: %v", e)
		}
	}
	l, err := netlink.LinkByIndex(link.Attrs().Index)
	if err != nil {
		t.Fatal(err)
	}
	a := l.Attrs()
	if a.HardwareAddr.String() != "02:aa:bb:cc:dd:ee" || a.MTU != 1400 || a.Flags&net.FlagUp == 0 {
		t.Errorf("link %s mtu %d flags %v, want the new MAC, MTU 1400, up", a.HardwareAddr, a.MTU, a.Flags)
	}
	if got, want := addresses(t, l), []string{"10.88.0.4/16", "fd00::4/64"}; !slices.Equal(got, want) {
		t.Errorf("addresses %v, want %v", got, want)
	}
	want := []string{"0.0.0.0/0 via 10.99.0.1 metric 100", "10.77.0.0/16 via 192.168.0.1 onlink", "10.99.0.0/16 src 10.88.0.4 link", "::/0 via fd00::1"}
	if got := routes(t, l); !slices.Equal(got, want) {
		t.Errorf("routes %v, want %v", got, want)
	}
	for _, name := range []string{decoy.Name, decoy.PeerName} {
		if d, err := netlink.LinkByName(name); err != nil || d.Attrs().Flags&net.FlagUp != 0 {
			t.Errorf("decoy %s changed: %v", name, err)
		}
	}

	// No network: down, with nothing left.
	if err := (Netlink{Driver: nicDriver}).Configure(nil); err != nil {
		t.Fatal(err)
	}
	l, _ = netlink.LinkByIndex(link.Attrs().Index)
	if l.Attrs().Flags&net.FlagUp != 0 || len(addresses(t, l)) != 0 || len(routes(t, l)) != 0 {
		t.Errorf("after no network: flags %v addresses %v routes %v, want down and bare", l.Attrs().Flags, addresses(t, l), routes(t, l))
	}
}

// addresses lists l's addresses but the IPv6 link-local one the kernel
// makes when a link comes up.
func addresses(t *testing.T, l netlink.Link) []string {
	list, err := netlink.AddrList(l, netlink.FAMILY_ALL)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		t.Fatal(err)
	}
	var out []string
	for _, a := range list {
		if !a.IP.IsLinkLocalUnicast() {
			out = append(out, a.IPNet.String())
		}
	}
	slices.Sort(out)
	return out
}

// routes lists the routes through l that were added, not made by the
// kernel for its addresses.
func routes(t *testing.T, l netlink.Link) []string {
	list, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{LinkIndex: l.Attrs().Index}, netlink.RT_FILTER_OIF)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		t.Fatal(err)
	}
	var out []string
	for _, r := range list {
		if r.Protocol == unix.RTPROT_KERNEL {
			continue
		}
		s := "0.0.0.0/0"
		if r.Dst != nil {
			s = r.Dst.String()
		} else if r.Family == netlink.FAMILY_V6 {
			s = "::/0"
		}
		if r.Gw != nil {
			s += " via " + r.Gw.String()
		}
		if r.Src != nil {
			s += " src " + r.Src.String()
		}
		if r.Scope == netlink.SCOPE_LINK {
			s += " link"
		}
		if r.Flags&int(netlink.FLAG_ONLINK) != 0 {
			s += " onlink"
		}
		if r.Priority != 0 && r.Family == netlink.FAMILY_V4 {
			s += " metric " + strconv.Itoa(r.Priority)
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// TestNetlinkFindsOneNIC: no NIC is fine with no network and an error
// with one; two NICs of the driver are an error naming them.
func TestNetlinkFindsOneNIC(t *testing.T) {
	enterNewNetns(t)
	if err := (Netlink{}).Configure(nil); err != nil {
		t.Errorf("no virtio_net NIC and no network: %v", err)
	}
	if err := (Netlink{}).Configure(testNetConfig); !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "no virtio_net interface") {
		t.Errorf("no virtio_net NIC: %v, want not found", err)
	}
	a, b := addNIC(t, "02:00:00:00:00:01"), addNIC(t, "02:00:00:00:00:02")
	err := (Netlink{Driver: nicDriver}).Configure(testNetConfig)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), a.Attrs().Name) || !strings.Contains(err.Error(), b.Attrs().Name) {
		t.Errorf("two NICs: %v, want an error naming both", err)
	}
}

// BenchmarkNetlinkDown measures taking the NIC down (an Init without a
// network), on a tap in a new network namespace. No sub-benchmarks: they
// would run on other threads, outside the namespace.
func BenchmarkNetlinkDown(b *testing.B) {
	benchmarkConfigure(b, nil)
}

// BenchmarkNetlinkConfigure measures giving the NIC a full configuration.
func BenchmarkNetlinkConfigure(b *testing.B) {
	benchmarkConfigure(b, testNetConfig)
}

func benchmarkConfigure(b *testing.B, cfg *NetConfig) {
	enterNewNetns(b)
	addNIC(b, "02:00:00:00:00:01")
	for b.Loop() {
		if err := (Netlink{Driver: nicDriver}).Configure(cfg); err != nil {
			b.Fatal(err)
		}
	}
}
