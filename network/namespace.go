// Package network is the host side of a VM's networking: it finds the
// interface a task's network namespace was given (by CNI, nerdctl or a
// hand-made veth), creates a tap in that namespace, and joins the two with
// tc mirred redirects in both directions, so the guest, wearing the
// interface's MAC and addresses, sends and receives exactly what the
// interface would have. No bridge, no MAC learning, no shelling out: every
// change goes through netlink inside the namespace.
package network

import (
	"fmt"
	"os"
	"runtime"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/fsmode"
)

// Namespace is the network namespace a task's VM runs in, held open by an
// nsfs file: the namespace lives at least as long as the Namespace.
type Namespace struct {
	f    *os.File
	path string
}

// Open opens the network namespace at path (a bind mount such as
// /var/run/netns/NAME or a /proc/PID/ns/net link, as an OCI spec's
// linux.namespaces entry names it). Whatever else the path is, Open does
// not open it: a FIFO would block the open until a writer came, a device
// would see an open.
func Open(path string) (*Namespace, error) {
	f, err := openNetNS(path)
	if err != nil {
		return nil, fmt.Errorf("open network namespace %s: %w", path, err)
	}
	return &Namespace{f: f, path: path}, nil
}

// openNetNS looks at path through an O_PATH descriptor, which opens
// nothing, and opens it for reading (setns and the type ioctl need that)
// only once it is an nsfs file, through that descriptor: a path replaced
// in between is not opened either.
func openNetNS(path string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	if err := checkNSFS(fd); err != nil {
		return nil, err
	}
	f, err := os.Open(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		return nil, err
	}
	if err := checkNetNS(f); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// New creates a network namespace owned by the caller, with lo up. It is
// not bind-mounted anywhere: it lives while the Namespace, or a process
// started inside it, holds it, and the kernel removes it after that.
func New() (*Namespace, error) {
	tmp, err := ns.TempNetNS()
	if err != nil {
		return nil, fmt.Errorf("create network namespace: %w", err)
	}
	defer tmp.Close()
	// TempNetNS names the namespace by a thread that is gone once it
	// returns: keep our own descriptor and name it by that.
	fd, err := unix.FcntlInt(tmp.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("duplicate network namespace descriptor: %w", err)
	}
	path := fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), fd)
	n := &Namespace{f: os.NewFile(uintptr(fd), path), path: path}
	if err := n.loopbackUp(); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// File is the namespace's nsfs file, to hand to a process or hypervisor
// that must join it. It stays owned by n.
func (n *Namespace) File() *os.File { return n.f }

// Path names the namespace for hooks and logs: the path it was opened
// from, or /proc/PID/fd/N of this process for a namespace made by New
// (valid while n is open).
func (n *Namespace) Path() string { return n.path }

// Close releases n's hold on the namespace.
func (n *Namespace) Close() error {
	if err := n.f.Close(); err != nil {
		return fmt.Errorf("close network namespace %s: %w", n.path, err)
	}
	return nil
}

// Do runs fn on an OS thread inside n. Processes fn starts (exec.Cmd.Start
// from fn's goroutine) are born inside n; goroutines fn starts are not.
func (n *Namespace) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		// The thread stays locked unless it gets back to its own namespace:
		// a locked thread dies with its goroutine, so a thread in n never
		// runs anything else.
		runtime.LockOSThread()
		errc <- n.do(fn)
	}()
	return <-errc
}

func (n *Namespace) do(fn func() error) error {
	orig, err := netns.Get()
	if err != nil {
		return fmt.Errorf("open current network namespace: %w", err)
	}
	defer orig.Close()
	if err := netns.Set(netns.NsHandle(n.f.Fd())); err != nil {
		return fmt.Errorf("enter network namespace %s: %w", n.path, err)
	}
	fnErr := fn()
	if err := netns.Set(orig); err == nil {
		runtime.UnlockOSThread()
	}
	return fnErr
}

// handle is a rtnetlink handle whose requests act inside n.
func (n *Namespace) handle() (*netlink.Handle, error) {
	h, err := netlink.NewHandleAt(netns.NsHandle(n.f.Fd()), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("open netlink in network namespace %s: %w", n.path, err)
	}
	return h, nil
}

// locked runs fn with a netlink handle inside n, holding n's lock.
func (n *Namespace) locked(fn func(h *netlink.Handle) error) error {
	unlock, err := n.lock()
	if err != nil {
		return err
	}
	defer unlock()
	h, err := n.handle()
	if err != nil {
		return err
	}
	defer h.Close()
	return fn(h)
}

// lock serializes changes to n's tc setup against every other process and
// Namespace doing the same (flock on the namespace inode), so two VMs
// cannot both take one interface. The returned func unlocks.
func (n *Namespace) lock() (func(), error) {
	f, err := os.Open(fmt.Sprintf("/proc/self/fd/%d", n.f.Fd()))
	if err != nil {
		return nil, fmt.Errorf("lock network namespace %s: %w", n.path, err)
	}
	// A fresh open file description per call: flock excludes between
	// descriptions, so goroutines sharing n exclude each other too.
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock network namespace %s: %w", n.path, err)
	}
	return func() { f.Close() }, nil
}

func (n *Namespace) loopbackUp() error {
	h, err := n.handle()
	if err != nil {
		return err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		return fmt.Errorf("set lo up in %s: %w", n.path, err)
	}
	return nil
}

// checkNSFS fails, saying what fd is instead, unless it is an nsfs inode.
// The kernel is asked, not the file's name: a bind mount (/run/netns/NAME,
// as CNI and CRI pin namespaces) reads back as its mount point, not as
// "net:[INODE]".
func checkNSFS(fd int) error {
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return fmt.Errorf("stat file system: %w", err)
	}
	if fs.Type == unix.NSFS_MAGIC {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat: %w", err)
	}
	return fmt.Errorf("a %s, %w", fsmode.TypeName(fsmode.FromStat(st.Mode)), errNotNetNS)
}

// checkNetNS fails unless the nsfs file f is a namespace of type
// CLONE_NEWNET.
func checkNetNS(f *os.File) error {
	typ, err := unix.IoctlRetInt(int(f.Fd()), unix.NS_GET_NSTYPE)
	if err != nil {
		return fmt.Errorf("ask namespace type: %w", err)
	}
	if typ != unix.CLONE_NEWNET {
		return fmt.Errorf("a namespace of another type, %w", errNotNetNS)
	}
	return nil
}
