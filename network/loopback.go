package network

import (
	"errors"
	"fmt"
	"net"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// loopbackTable is the nftables table ListenLoopback adds to a namespace.
const loopbackTable = "cocoon-loopback"

// LoopbackListener takes every TCP connection a process inside a namespace
// makes over its loopback (to 127.0.0.1:PORT, any port): containerd's CRI
// dials localhost:PORT in the pod's namespace to forward a port, and with
// the pod's processes in a VM nothing there listens. A NAT redirect in the
// namespace's output hook sends each such connection to one listener, which
// reads the port it was made to from conntrack. Only a process inside the
// namespace can connect: the listener is bound to that namespace's
// loopback, and traffic arriving from outside never takes the output hook.
type LoopbackListener struct {
	ns *Namespace
	ln *net.TCPListener
}

// ListenLoopback starts taking n's loopback TCP connections. Close stops it
// and removes the redirect; a namespace that dies first takes both along.
func (n *Namespace) ListenLoopback() (*LoopbackListener, error) {
	var ln *net.TCPListener
	err := n.Do(func() error {
		var err error
		ln, err = net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen on loopback in %s: %w", n.path, err)
	}
	l := &LoopbackListener{ns: n, ln: ln}
	if err := l.redirect(uint16(ln.Addr().(*net.TCPAddr).Port)); err != nil {
		return nil, errors.Join(err, ln.Close())
	}
	return l, nil
}

// redirect replaces the namespace's loopback table with one sending every
// new TCP connection out of lo to port. A table left by an earlier holder
// of the namespace (a VM before this one, a shim that crashed) goes.
func (l *LoopbackListener) redirect(port uint16) error {
	c, err := nftables.New(nftables.WithNetNSFd(int(l.ns.f.Fd())))
	if err != nil {
		return fmt.Errorf("open nftables in %s: %w", l.ns.path, err)
	}
	t := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: loopbackTable}
	c.AddTable(t) // so that the delete finds one
	c.DelTable(t)
	c.AddTable(t)
	ch := c.AddChain(&nftables.Chain{Name: "output", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest})
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname("lo")},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.Redir{RegisterProtoMin: 1},
	}})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("redirect loopback TCP in %s: %w", l.ns.path, err)
	}
	return nil
}

// ifname is name as nftables compares interface names: NUL-padded to IFNAMSIZ.
func ifname(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

// Accept waits for the next connection and returns it with the port it was
// made to.
func (l *LoopbackListener) Accept() (*net.TCPConn, uint16, error) {
	for {
		c, err := l.ln.AcceptTCP()
		if err != nil {
			return nil, 0, err
		}
		port, err := originalPort(c)
		if err == nil {
			return c, port, nil
		}
		// Not redirected (conntrack forgot it, or no table): nobody to tell.
		_ = c.Close()
	}
}

// originalPort is the destination port c was made to before the redirect.
func originalPort(c *net.TCPConn) (uint16, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var addr *unix.IPv6Mreq // SO_ORIGINAL_DST answers a sockaddr_in this size
	var opErr error
	if err := rc.Control(func(fd uintptr) {
		addr, opErr = unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
	}); err != nil {
		return 0, err
	}
	if opErr != nil {
		return 0, fmt.Errorf("original destination: %w", opErr)
	}
	return uint16(addr.Multiaddr[2])<<8 | uint16(addr.Multiaddr[3]), nil
}

// Close stops taking connections and removes the redirect.
func (l *LoopbackListener) Close() error {
	err := l.ln.Close()
	c, cerr := nftables.New(nftables.WithNetNSFd(int(l.ns.f.Fd())))
	if cerr == nil {
		c.DelTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: loopbackTable})
		cerr = c.Flush()
	}
	if cerr != nil && !errors.Is(cerr, unix.ENOENT) {
		err = errors.Join(err, fmt.Errorf("remove loopback redirect in %s: %w", l.ns.path, cerr))
	}
	return err
}
