package network

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Tap is a persistent tap (IFF_TAP|IFF_NO_PI, no vnet header) inside a
// namespace: it outlives File, and Release deletes it.
type Tap struct {
	Name  string
	Index int
	// File is an open queue of the tap, for the hypervisor's NIC backend.
	File *os.File
}

// TapName is the tap name of task taskID: deterministic, so a crashed
// task's tap can be found again, and a hash, so it fits IFNAMSIZ.
func TapName(taskID string) string {
	sum := sha256.Sum256([]byte(taskID))
	return "ctap" + hex.EncodeToString(sum[:])[:11]
}

// CreateTap creates the tap name in n with MTU mtu (0 keeps the kernel's
// default), down and without IPv6 link-local address: Connect brings it up.
func CreateTap(n *Namespace, name string, mtu int) (*Tap, error) {
	if err := checkLinkName(name); err != nil {
		return nil, err
	}
	var t *Tap
	// TUNSETIFF creates the device in the calling thread's namespace.
	err := n.Do(func() error {
		var err error
		t, err = createTap(n, name, mtu)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create tap %s in %s: %w", name, n.path, err)
	}
	return t, nil
}

func createTap(n *Namespace, name string, mtu int) (*Tap, error) {
	h, err := n.handle()
	if err != nil {
		return nil, err
	}
	defer h.Close()
	if _, err := h.LinkByName(name); err == nil {
		return nil, errors.New("a link of that name already exists")
	}
	link := &netlink.Tuntap{
		LinkAttrs: netlink.LinkAttrs{Name: name},
		Mode:      netlink.TUNTAP_MODE_TAP,
		// TUN_EXCL: never attach to a tap someone else created meanwhile.
		Flags:  netlink.TUNTAP_NO_PI | netlink.TUNTAP_TUN_EXCL,
		Queues: 1,
	}
	if err := h.LinkAdd(link); err != nil {
		return nil, err
	}
	t := &Tap{Name: name, Index: link.Index, File: link.Fds[0]}
	if err := configureTap(h, link, mtu); err != nil {
		t.File.Close()
		if delErr := h.LinkDel(link); delErr != nil {
			err = errors.Join(err, fmt.Errorf("delete tap: %w", delErr))
		}
		return nil, err
	}
	return t, nil
}

func configureTap(h *netlink.Handle, link *netlink.Tuntap, mtu int) error {
	if link.Index == 0 {
		return errors.New("tap created but not found by name")
	}
	if mtu > 0 {
		if err := h.LinkSetMTU(link, mtu); err != nil {
			return fmt.Errorf("set mtu %d: %w", mtu, err)
		}
	}
	// Without a link-local address the namespace's own IPv6 stack sends
	// nothing (router or neighbour solicitations, MLD) into the guest.
	// EAFNOSUPPORT: a kernel booted without IPv6 has nothing to turn off.
	err := h.LinkSetIP6AddrGenMode(link, nl.IN6_ADDR_GEN_MODE_NONE)
	if err != nil && !errors.Is(err, unix.EAFNOSUPPORT) {
		return fmt.Errorf("turn off IPv6 address generation: %w", err)
	}
	return nil
}

// checkLinkName rejects what the kernel would refuse or misread (a name
// with '%' is a template that TUNSETIFF would fill in).
func checkLinkName(name string) error {
	if name == "" || len(name) >= unix.IFNAMSIZ || strings.ContainsAny(name, "/%: \t\n") {
		return fmt.Errorf("invalid tap name %q: want 1-%d characters without '/', '%%', ':' or spaces", name, unix.IFNAMSIZ-1)
	}
	return nil
}
