package network

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// connected is a pod whose eth0 is connected to a fresh tap.
func connected(t *testing.T) (*pod, Interface, *Tap) {
	t.Helper()
	p := newPod(t)
	iface, err := Discover(p.ns)
	if err != nil {
		t.Fatal(err)
	}
	tap := testTap(t, p.ns, iface.Name)
	if err := Connect(p.ns, iface, tap); err != nil {
		t.Fatal(err)
	}
	return p, iface, tap
}

// TestConnectTraffic: after Connect, what the peer sends to the pod's
// address is read from the tap, and a frame written into the tap with
// eth0's identity reaches a socket in the peer.
func TestConnectTraffic(t *testing.T) {
	p, _, tap := connected(t)
	inNS(t, p.ns, func(h *netlink.Handle) error {
		l, err := h.LinkByIndex(tap.Index)
		if err != nil {
			return err
		}
		if l.Attrs().MTU != 1400 || l.Attrs().Flags&net.FlagUp == 0 {
			t.Errorf("tap mtu %d flags %v, want 1400 and up", l.Attrs().MTU, l.Attrs().Flags)
		}
		return nil
	})

	t.Run("peer to tap", func(t *testing.T) {
		inNS(t, p.peer, func(h *netlink.Handle) error {
			return h.NeighAdd(&netlink.Neigh{
				LinkIndex: p.peerLink.Attrs().Index, IP: p.ip4, HardwareAddr: p.mac, State: netlink.NUD_PERMANENT,
			})
		})
		var conn *net.UDPConn
		err := p.peer.Do(func() (err error) {
			conn, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: p.ip4, Port: 4000})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.Write([]byte("from-peer")); err != nil {
			t.Fatal(err)
		}
		frame := readUDPFrame(t, tap.File, 4000)
		if !bytes.Equal(frame[0:6], p.mac) || !bytes.Equal(frame[6:12], p.peerMAC) {
			t.Errorf("frame MACs %s <- %s, want %s <- %s", net.HardwareAddr(frame[0:6]), net.HardwareAddr(frame[6:12]), p.mac, p.peerMAC)
		}
		if src, _, payload := parseUDP4(frame); !src.Equal(p.peerIP4) || string(payload) != "from-peer" {
			t.Errorf("frame from %s with %q, want from %s with %q", src, payload, p.peerIP4, "from-peer")
		}
	})

	t.Run("tap to peer", func(t *testing.T) {
		var conn *net.UDPConn
		err := p.peer.Do(func() (err error) {
			conn, err = net.ListenUDP("udp4", &net.UDPAddr{IP: p.peerIP4, Port: 4001})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		frame := udpFrame(p.peerMAC, p.mac, p.ip4, p.peerIP4, 4002, 4001, []byte("from-guest"))
		if _, err := tap.File.Write(frame); err != nil {
			t.Fatal(err)
		}
		if err := conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 1500)
		n, from, err := conn.ReadFromUDP(buf)
		if err != nil {
			t.Fatalf("peer received nothing the tap sent: %v", err)
		}
		if string(buf[:n]) != "from-guest" || !from.IP.Equal(p.ip4) || from.Port != 4002 {
			t.Errorf("peer got %q from %s, want %q from %s:4002", buf[:n], from, "from-guest", p.ip4)
		}
	})
}

// TestConnectInUse: a live tap owns the interface; once it is gone (its
// VM crashed) another tap takes over; Release then leaves eth0 as it was.
func TestConnectInUse(t *testing.T) {
	p, iface, first := connected(t)
	second := testTap(t, p.ns, iface.Name)

	err := Connect(p.ns, iface, second)
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), first.Name) {
		t.Fatalf("Connect with a live redirect: %v; want ErrInUse naming %s", err, first.Name)
	}
	if got := redirectsOf(t, p.ns, "eth0"); len(got) != 1 || got[0] != first.Index {
		t.Fatalf("after a refused Connect eth0 redirects to %v, want [%d]", got, first.Index)
	}

	first.File.Close()
	inNS(t, p.ns, func(h *netlink.Handle) error {
		l, err := h.LinkByIndex(first.Index)
		if err != nil {
			return err
		}
		return h.LinkDel(l)
	})
	for range 2 { // the second time reconnects the same tap
		if err := Connect(p.ns, iface, second); err != nil {
			t.Fatalf("Connect after the first tap is gone: %v", err)
		}
		if got := redirectsOf(t, p.ns, "eth0"); len(got) != 1 || got[0] != second.Index {
			t.Fatalf("eth0 redirects to %v, want [%d]", got, second.Index)
		}
	}

	for range 2 {
		if err := Release(p.ns.Path(), "eth0", second.Name); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	inNS(t, p.ns, func(h *netlink.Handle) error {
		if _, err := h.LinkByName(second.Name); !isNotFound(err) {
			t.Errorf("tap %s after Release: %v, want not found", second.Name, err)
		}
		eth0, err := h.LinkByName("eth0")
		if err != nil {
			return err
		}
		qdiscs, err := h.QdiscList(eth0)
		if err != nil {
			return err
		}
		for _, q := range qdiscs {
			if q.Type() == "ingress" {
				t.Error("eth0 keeps an ingress qdisc after Release")
			}
		}
		return nil
	})
}

// TestConnectConcurrent: of two taps connecting to one interface at once,
// exactly one wins.
func TestConnectConcurrent(t *testing.T) {
	p := newPod(t)
	iface, err := Discover(p.ns)
	if err != nil {
		t.Fatal(err)
	}
	taps := []*Tap{testTap(t, p.ns, iface.Name), testTap(t, p.ns, iface.Name)}
	errs := make([]error, len(taps))
	var wg sync.WaitGroup
	for i, tap := range taps {
		wg.Go(func() { errs[i] = Connect(p.ns, iface, tap) })
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, ErrInUse):
			t.Errorf("Connect: %v, want nil or ErrInUse", err)
		}
	}
	if won != 1 || len(redirectsOf(t, p.ns, "eth0")) != 1 {
		t.Errorf("%d Connects won and eth0 has redirects %v; want exactly one", won, redirectsOf(t, p.ns, "eth0"))
	}
}

// TestRelease: Release tolerates everything being gone, and never deletes
// a link that is not a tap.
func TestRelease(t *testing.T) {
	p := newPod(t)
	closed, err := New()
	if err != nil {
		t.Fatal(err)
	}
	closedPath := closed.Path()
	closed.Close()
	regular := filepath.Join(t.TempDir(), "netns")
	if err := os.WriteFile(regular, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, path, iface, tap string
		err                    string
	}{
		{name: "missing path", path: filepath.Join(t.TempDir(), "gone"), iface: "eth0", tap: "ctapgone"},
		{name: "unmounted namespace file", path: regular, iface: "eth0", tap: "ctapgone"},
		{name: "closed New namespace", path: closedPath, iface: "eth0", tap: "ctapgone"},
		{name: "interface and tap gone", path: p.ns.Path(), iface: "eth9", tap: "ctapgone"},
		{name: "tap gone", path: p.ns.Path(), iface: "eth0", tap: "ctapgone"},
		{name: "not a tap", path: p.ns.Path(), iface: "lo", tap: "eth0", err: "link eth0 is a veth, not a tap"},
	}
	unconnected, err := CreateTap(p.ns, "ctapunconn", 0)
	if err != nil {
		t.Fatal(err)
	}
	unconnected.File.Close()
	tests = append(tests, struct {
		name, path, iface, tap string
		err                    string
	}{name: "a tap never connected (no interface)", path: p.ns.Path(), tap: unconnected.Name})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Release(tc.path, tc.iface, tc.tap)
			if tc.err == "" && err != nil {
				t.Fatalf("Release: %v", err)
			}
			if tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("Release error = %v, want one containing %q", err, tc.err)
			}
		})
	}
	inNS(t, p.ns, func(h *netlink.Handle) error {
		if _, err := h.LinkByName(unconnected.Name); err == nil {
			return fmt.Errorf("tap %s still exists after its release", unconnected.Name)
		}
		_, err := h.LinkByName("eth0")
		return err
	})
}

// redirectsOf lists the ifindexes name's ingress filters redirect to.
func redirectsOf(t *testing.T, n *Namespace, name string) []int {
	t.Helper()
	var out []int
	inNS(t, n, func(h *netlink.Handle) error {
		l, err := h.LinkByName(name)
		if err != nil {
			return err
		}
		filters, err := redirects(h, l)
		for _, f := range filters {
			out = append(out, redirectTarget(f))
		}
		return err
	})
	return out
}

// readUDPFrame reads frames from f until an IPv4 UDP one to port dport.
func readUDPFrame(t *testing.T, f *os.File, dport int) []byte {
	t.Helper()
	if err := f.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 65536)
	for {
		n, err := f.Read(buf)
		if err != nil {
			t.Fatalf("no UDP frame to port %d came out of the tap: %v", dport, err)
		}
		frame := buf[:n]
		if _, port, _ := parseUDP4(frame); port == dport {
			return frame
		}
	}
}

// udpFrame is an Ethernet frame carrying an IPv4 UDP datagram (no UDP
// checksum, which IPv4 allows).
func udpFrame(dstMAC, srcMAC net.HardwareAddr, src, dst net.IP, sport, dport int, payload []byte) []byte {
	ip := make([]byte, 20, 28+len(payload))
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(28+len(payload)))
	ip[8] = 64
	ip[9] = 17
	copy(ip[12:16], src.To4())
	copy(ip[16:20], dst.To4())
	binary.BigEndian.PutUint16(ip[10:], checksum(ip))
	udp := make([]byte, 8)
	binary.BigEndian.PutUint16(udp[0:], uint16(sport))
	binary.BigEndian.PutUint16(udp[2:], uint16(dport))
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	frame := append(append([]byte{}, dstMAC...), srcMAC...)
	frame = binary.BigEndian.AppendUint16(frame, 0x0800)
	return append(append(append(frame, ip...), udp...), payload...)
}

// parseUDP4 returns the source, destination port and payload of an
// Ethernet IPv4 UDP frame; port is 0 for any other frame.
func parseUDP4(frame []byte) (src net.IP, port int, payload []byte) {
	if len(frame) < 14+20+8 || binary.BigEndian.Uint16(frame[12:]) != 0x0800 || frame[14+9] != 17 {
		return nil, 0, nil
	}
	ip := frame[14:]
	udp := ip[int(ip[0]&0x0f)*4:]
	if len(udp) < 8 {
		return nil, 0, nil
	}
	end := min(int(binary.BigEndian.Uint16(udp[4:])), len(udp))
	return net.IP(ip[12:16]), int(binary.BigEndian.Uint16(udp[2:])), udp[8:end]
}

func checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// TestReleaseByTapOnly: a crashed shim records only the namespace and the
// tap; Release then finds the interface's redirects to that tap itself.
func TestReleaseByTapOnly(t *testing.T) {
	p, iface, tap := connected(t)
	if err := Release(p.ns.Path(), "", tap.Name); err != nil {
		t.Fatal(err)
	}
	if got := redirectsOf(t, p.ns, iface.Name); len(got) != 0 {
		t.Fatalf("%s still redirects to %v after the tap's release", iface.Name, got)
	}
	inNS(t, p.ns, func(h *netlink.Handle) error {
		if _, err := h.LinkByName(tap.Name); err == nil {
			return fmt.Errorf("tap %s still exists", tap.Name)
		}
		qdiscs, err := h.QdiscList(p.eth0)
		for _, q := range qdiscs {
			if q.Type() == "ingress" {
				return fmt.Errorf("%s keeps an ingress qdisc", iface.Name)
			}
		}
		return err
	})
}

// TestReleaseTapUnpinned: a namespace whose bind mount went away lives on
// while it is held, with its tap and redirects; ReleaseTap removes them by
// the handle held, where a path no longer names the namespace.
func TestReleaseTapUnpinned(t *testing.T) {
	testenv.RequireRoot(t)
	pinned, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pinned.Close(); _ = testutils.UnmountNS(pinned) })
	n, err := Open(pinned.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	eth0 := addVeth(t, n, "eth0", 0, newNS(t), "peer0", "10.1.2.2/24")
	addRoute(t, n, eth0, "", "10.1.2.1", 0)
	iface, err := Discover(n)
	if err != nil {
		t.Fatal(err)
	}
	tap := testTap(t, n, iface.Name)
	if err := Connect(n, iface, tap); err != nil {
		t.Fatal(err)
	}
	// As `ip netns delete` does: detached, since n keeps the mount busy.
	if err := unix.Unmount(pinned.Path(), unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(pinned.Path()); err != nil {
		t.Fatal(err)
	}
	if err := n.ReleaseTap(iface.Name, tap.Name); err != nil {
		t.Fatalf("ReleaseTap: %v", err)
	}
	if got := redirectsOf(t, n, iface.Name); len(got) != 0 {
		t.Errorf("%s still redirects to %v after ReleaseTap", iface.Name, got)
	}
	inNS(t, n, func(h *netlink.Handle) error {
		if _, err := h.LinkByName(tap.Name); !isNotFound(err) {
			return fmt.Errorf("tap %s after ReleaseTap: %v, want not found", tap.Name, err)
		}
		return nil
	})
}
