package cnitest

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
)

// cniTimeout bounds one ADD or DEL of the whole network.
const cniTimeout = 30 * time.Second

// Attachment is a container namespace joined to the node's network.
type Attachment struct {
	*Namespace
	ID string
	// IP is the container's address on the network, Net its subnet and
	// MAC its interface's (IfName) hardware address.
	IP  net.IP
	Net *net.IPNet
	MAC string
}

// Attach makes a network namespace for container id and adds it to the
// network (loopback, then the bridge network, as containerd's CRI plugin
// does). t's Cleanup deletes it from the network and removes the namespace.
func (n *Node) Attach(t testing.TB, id string) *Attachment {
	t.Helper()
	a := &Attachment{Namespace: NewNamespace(t), ID: id}
	rt := &libcni.RuntimeConf{ContainerID: id, NetNS: a.Path, IfName: IfName}
	lo := &libcni.RuntimeConf{ContainerID: id, NetNS: a.Path, IfName: "lo"}
	ctx, cancel := context.WithTimeout(context.Background(), cniTimeout)
	defer cancel()
	var res types.Result
	err := n.invoke(ctx, func(ctx context.Context) error {
		if _, err := n.cni.AddNetwork(ctx, n.loopback, lo); err != nil {
			return fmt.Errorf("loopback: %w", err)
		}
		var err error
		res, err = n.cni.AddNetworkList(ctx, n.conflist, rt)
		return err
	})
	// Registered even when ADD failed: DEL cleans up a half-made attachment.
	t.Cleanup(func() { n.detach(t, rt, lo) })
	if err != nil {
		t.Fatalf("CNI ADD %s: %v", id, err)
	}
	if err := a.fill(res); err != nil {
		t.Fatalf("CNI ADD %s: %v", id, err)
	}
	return a
}

func (n *Node) detach(t testing.TB, rt, lo *libcni.RuntimeConf) {
	ctx, cancel := context.WithTimeout(context.Background(), cniTimeout)
	defer cancel()
	err := n.invoke(ctx, func(ctx context.Context) error {
		if err := n.cni.DelNetworkList(ctx, n.conflist, rt); err != nil {
			return err
		}
		return n.cni.DelNetwork(ctx, n.loopback, lo)
	})
	if err != nil {
		t.Errorf("CNI DEL %s: %v", rt.ContainerID, err)
	}
}

// fill takes the address and MAC the bridge network gave the container.
func (a *Attachment) fill(res types.Result) error {
	r, err := types100.NewResultFromResult(res)
	if err != nil {
		return fmt.Errorf("read result: %w", err)
	}
	for _, ip := range r.IPs {
		if v4 := ip.Address.IP.To4(); v4 != nil {
			a.IP, a.Net = v4, &net.IPNet{IP: v4.Mask(ip.Address.Mask), Mask: ip.Address.Mask}
			break
		}
	}
	for _, iface := range r.Interfaces {
		if iface.Sandbox == a.Path && iface.Name == IfName {
			a.MAC = iface.Mac
		}
	}
	if a.IP == nil || a.MAC == "" {
		return fmt.Errorf("result %s: want an IPv4 address and the MAC of %s", r, IfName)
	}
	return nil
}
