package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/network"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
)

// vmNetwork is a task VM's network: the namespace its hypervisor runs in,
// the tap behind the snapshot's NIC and, once the createRuntime hooks have
// run (nerdctl sets up CNI there), the namespace's interface the guest
// takes over.
type vmNetwork struct {
	mu    sync.Mutex // Release may come from an init exit and a delete at once
	id    string
	ns    *network.Namespace
	path  string // the spec's namespace path; "" for one the shim made
	tap   *network.Tap
	iface *network.Interface // nil until connected, or with nothing to take over
	fwd   *portForward       // nil until forwardPorts, or in a namespace the shim made
	// forwarding is closed once forwardPorts' setup, which uses ns, ended.
	forwarding chan struct{}
}

// openNetwork prepares the network of task id's VM from its spec: none
// when the spec shares the runtime's network namespace (no network entry),
// else the namespace it names, or a new one the shim owns when it names
// none, with a tap in it.
func openNetwork(spec *specs.Spec, id string) (*vmNetwork, error) {
	entry, ok := networkEntry(spec)
	if !ok {
		return nil, nil
	}
	n := &vmNetwork{id: id, path: entry.Path}
	var err error
	if entry.Path != "" {
		n.ns, err = openSpecNamespace(entry.Path)
	} else {
		n.ns, err = network.New()
	}
	if err != nil {
		return nil, fmt.Errorf("task network namespace: %w", err)
	}
	if n.tap, err = network.CreateTap(n.ns, network.TapName(id), 0); err != nil {
		return nil, errors.Join(err, n.ns.Close())
	}
	return n, nil
}

// openSpecNamespace opens the namespace the spec names, refusing the
// host's before anything is made in it.
func openSpecNamespace(path string) (*network.Namespace, error) {
	ns, err := network.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	if err := ns.RefuseHost(); err != nil {
		return nil, errors.Join(fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument), ns.Close())
	}
	return ns, nil
}

func networkEntry(spec *specs.Spec) (specs.LinuxNamespace, bool) {
	if spec == nil || spec.Linux == nil {
		return specs.LinuxNamespace{}, false
	}
	for _, e := range spec.Linux.Namespaces {
		if e.Type == specs.NetworkNamespace {
			return e, true
		}
	}
	return specs.LinuxNamespace{}, false
}

// attach is what the hypervisor gets: its namespace and the tap.
func (n *vmNetwork) attach() (*os.File, *hypervisor.NIC) {
	if n == nil {
		return nil, nil
	}
	return n.ns.File(), &hypervisor.NIC{TapName: n.tap.Name, TapFile: n.tap.File}
}

// connect joins the tap to the namespace's interface and returns that
// interface for the guest to impersonate; nil when the namespace has none
// (a new namespace no hook configured): the guest's NIC then stays down.
func (n *vmNetwork) connect(ctx context.Context) (*network.Interface, error) {
	if n == nil {
		return nil, nil
	}
	iface, err := network.Discover(n.ns)
	if errors.Is(err, network.ErrNoInterface) {
		log.G(ctx).WithField("id", n.id).WithError(err).Info("no interface in the task's network namespace: the guest's NIC stays down")
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	err = network.Connect(n.ns, iface, n.tap)
	if errors.Is(err, network.ErrInUse) {
		return nil, fmt.Errorf("%w: a namespace's interface and address go to one VM at a time, so a pod runs one app container at a time (init containers one after another): %w", err, errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return nil, err
	}
	n.iface = &iface
	return &iface, nil
}

// adopt gives n, whose namespace the task's spec names (CNI's, a pod's),
// the tap of pooled, a VM's restored ahead in a namespace of its own: it
// replaces n's own, not yet connected, under its name. pooled is done
// with: its namespace lives on while the hypervisor runs in it, empty.
func (n *vmNetwork) adopt(pooled *vmNetwork) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	tap, err := n.ns.AdoptTap(pooled.ns, pooled.tap, n.tap.Name)
	if err != nil {
		return err
	}
	n.closeTap()
	n.tap = tap
	return pooled.ns.Close()
}

// guest is the NIC configuration the guest takes once connect has run:
// the namespace interface's identity, or nil (NIC down).
func (n *vmNetwork) guest() *agent.Network {
	if n == nil {
		return nil
	}
	return guestNetwork(n.iface)
}

// forwardPorts carries the connections made over the loopback of the
// spec's namespace (kubectl port-forward) to the guest, from a moment
// after it returns: setting it up (an nftables table in the namespace)
// takes tens of milliseconds, which no start waits for. A namespace the
// shim made has no one to make them. Without a forward the task still
// runs: the failure is logged, and a port-forward then finds no listener.
func (n *vmNetwork) forwardPorts(ctx context.Context, c *agent.Client, callTimeout time.Duration) {
	if n == nil || n.path == "" {
		return
	}
	n.forwarding = make(chan struct{})
	go func() {
		defer close(n.forwarding)
		fwd, err := startPortForward(ctx, n.id, n.ns, c, callTimeout)
		if err != nil {
			log.G(ctx).WithError(err).WithField("id", n.id).Warn("no port-forward into the VM")
			return
		}
		n.mu.Lock()
		n.fwd = fwd
		n.mu.Unlock()
	}()
}

// record is what `shim delete` needs to release the network after a crash:
// names only. A namespace the shim made dies with the hypervisor, taking
// the tap with it, so it is not recorded.
func (n *vmNetwork) record() *state.Network {
	if n == nil || n.path == "" {
		return nil
	}
	return &state.Network{NetNS: n.path, Tap: n.tap.Name}
}

// closeTap drops the shim's copy of the tap queue once the hypervisor has
// its own.
func (n *vmNetwork) closeTap() {
	if n != nil && n.tap.File != nil {
		n.tap.File.Close()
		n.tap.File = nil
	}
}

// Release disconnects and deletes the tap and lets go of the namespace.
// It is idempotent.
func (n *vmNetwork) Release() error {
	if n == nil {
		return nil
	}
	if n.forwarding != nil {
		<-n.forwarding
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ns == nil {
		return nil
	}
	n.closeTap()
	err := n.fwd.stop()
	n.fwd = nil
	var ifaceName string
	if n.iface != nil {
		ifaceName = n.iface.Name
	}
	// By the handle held, not the path: a namespace whose bind mount went
	// away meanwhile still lives, and so would the tap and redirects.
	err = errors.Join(err, n.ns.ReleaseTap(ifaceName, n.tap.Name), n.ns.Close())
	n.ns = nil
	return err
}
