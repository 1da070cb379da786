package network

import (
	"fmt"
	"testing"

	"github.com/vishvananda/netlink"
)

// BenchmarkNetwork measures the host part of a restore's network phase
// (setup: Discover, CreateTap, Connect) and of a task's delete (release:
// Release, dominated by the kernel unregistering the tap), each timed alone.
func BenchmarkNetwork(b *testing.B) {
	p := newPod(b)
	name := uniqueTapName(b)
	b.Cleanup(func() {
		if err := Release(p.ns.Path(), "eth0", name); err != nil {
			b.Error(err)
		}
	})
	setup := func() *Tap {
		iface, err := Discover(p.ns)
		if err != nil {
			b.Fatal(err)
		}
		tap, err := CreateTap(p.ns, name, 0)
		if err != nil {
			b.Fatal(err)
		}
		if err := Connect(p.ns, iface, tap); err != nil {
			b.Fatal(err)
		}
		return tap
	}
	release := func(tap *Tap) {
		tap.File.Close()
		if err := Release(p.ns.Path(), "eth0", name); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("setup", func(b *testing.B) {
		for range b.N {
			tap := setup()
			b.StopTimer()
			release(tap)
			b.StartTimer()
		}
	})
	b.Run("release", func(b *testing.B) {
		for range b.N {
			b.StopTimer()
			tap := setup()
			b.StartTimer()
			release(tap)
		}
	})
}

// BenchmarkDiscover measures Discover in a namespace with many links, each
// with addresses, as a node's host namespace has.
func BenchmarkDiscover(b *testing.B) {
	p := newPod(b)
	inNS(b, p.ns, func(h *netlink.Handle) error {
		for i := range 50 {
			v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("va%d", i)}, PeerName: fmt.Sprintf("vb%d", i)}
			if err := h.LinkAdd(v); err != nil {
				return err
			}
			for j, name := range []string{v.Name, v.PeerName} {
				l, err := h.LinkByName(name)
				if err != nil {
					return err
				}
				if err := addAddr(h, l, fmt.Sprintf("fd00:9:%x:%x::1/64", i, j)); err != nil {
					return err
				}
				if err := addAddr(h, l, fmt.Sprintf("10.9.%d.%d/32", i, j+1)); err != nil {
					return err
				}
			}
		}
		return nil
	})
	for b.Loop() {
		if _, err := Discover(p.ns); err != nil {
			b.Fatal(err)
		}
	}
}
