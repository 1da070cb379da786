package drivertest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// Net is a network namespace of the test's own with a persistent tap in
// it (IFF_TAP|IFF_NO_PI, one queue, held open), as the shim hands one to a
// restore. The namespace goes when the test ends and no process is left in
// it, and its tap with it.
type Net struct {
	NS  *os.File
	NIC *hypervisor.NIC
}

// NewNet makes a Net; it needs root.
func NewNet(t testing.TB) *Net {
	t.Helper()
	testenv.RequireRoot(t)
	id := make([]byte, 4)
	rand.Read(id)
	n := &Net{NIC: &hypervisor.NIC{TapName: "cvt" + hex.EncodeToString(id)}}
	err := onThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare netns: %w", err)
		}
		ns, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			return err
		}
		n.NS = ns
		tap := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: n.NIC.TapName},
			Mode: netlink.TUNTAP_MODE_TAP, Flags: netlink.TUNTAP_NO_PI, Queues: 1}
		if err := netlink.LinkAdd(tap); err != nil {
			return fmt.Errorf("add tap: %w", err)
		}
		n.NIC.TapFile = tap.Fds[0]
		return nil
	})
	t.Cleanup(func() {
		for _, f := range []*os.File{n.NIC.TapFile, n.NS} {
			if f != nil {
				f.Close()
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// AddTuntap creates link in n (TUNSETIFF creates a device in the calling
// thread's namespace) and closes its queues when t ends.
func (n *Net) AddTuntap(t testing.TB, link *netlink.Tuntap) {
	t.Helper()
	err := onThread(func() error {
		if err := netns.Set(netns.NsHandle(int(n.NS.Fd()))); err != nil {
			return err
		}
		return netlink.LinkAdd(link)
	})
	if err != nil {
		t.Fatalf("add %s: %v", link.Name, err)
	}
	t.Cleanup(func() {
		for _, f := range link.Fds {
			f.Close()
		}
	})
}

// onThread runs fn on a locked OS thread that is put back in our network
// namespace afterwards; a thread that cannot go back ends with its
// goroutine.
func onThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		err = fn()
		// Back in its namespace before the caller goes on: the thread may
		// be the main one, whose namespace /proc/PID/ns/net shows.
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// Handle is a netlink handle acting in n.
func (n *Net) Handle(t testing.TB) *netlink.Handle {
	t.Helper()
	h, err := netlink.NewHandleAt(netns.NsHandle(int(n.NS.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// Tap is the tap as n sees it now.
func (n *Net) Tap(t testing.TB) *netlink.Tuntap {
	t.Helper()
	l, err := n.Handle(t).LinkByName(n.NIC.TapName)
	if err != nil {
		t.Fatal(err)
	}
	return l.(*netlink.Tuntap)
}

// Links lists the names of n's links, sorted.
func (n *Net) Links(t testing.TB) []string {
	t.Helper()
	return linkNames(t, n.Handle(t))
}

// LinksOf lists the names of the links in process pid's network
// namespace, sorted.
func LinksOf(t testing.TB, pid int) []string {
	t.Helper()
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	return linkNames(t, h)
}

func linkNames(t testing.TB, h *netlink.Handle) []string {
	t.Helper()
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range links {
		names = append(names, l.Attrs().Name)
	}
	slices.Sort(names)
	return names
}

// TapsOf lists the taps process pid holds a queue of: the iff line of its
// /dev/net/tun descriptors' fdinfo.
func TapsOf(t testing.TB, pid int) []string {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fdinfo", pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var taps []string
	for _, fd := range fds {
		b, err := os.ReadFile(filepath.Join(dir, fd.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		for _, line := range strings.Split(string(b), "\n") {
			if name, ok := strings.CutPrefix(line, "iff:\t"); ok {
				taps = append(taps, name)
			}
		}
	}
	return taps
}

// NetNSOf is the inode of process pid's network namespace.
func NetNSOf(t testing.TB, pid int) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// NSInode is the inode of the namespace file f.
func NSInode(t testing.TB, f *os.File) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}
