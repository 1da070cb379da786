package network

import "testing"

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
