// Package cnitest gives tests a node of their own: a network namespace the
// test made, holding a CNI bridge network (bridge + host-local, loopback for
// containers) whose bridge lives in that namespace, so tests send traffic
// only between namespaces they created. It attaches container namespaces to
// the network and reaches their addresses from the node (HTTP GET, ping).
// Everything is removed by the test's Cleanup.
//
//	node := cnitest.New(t, filepath.Join(testenv.RepoRoot(), "bin", "cni"))
//	c := node.Attach(t, "c1")                   // c.Path: for ctr run --with-ns network:PATH
//	body, err := node.HTTPGet(ctx, "http://"+c.IP.String()+":80/")
//
// A containerd with the CRI plugin runs inside node.Path (nsenter --net)
// with node.BinDir and node.ConfDir as its CNI dirs: its bridge then lives
// in the node too.
package cnitest

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
)

// Plugins are the CNI plugins a node's network needs in its bin dir.
var Plugins = []string{"bridge", "host-local", "loopback"}

const (
	// NetworkName is the bridge network's name in its config list.
	NetworkName = "cnitest"
	// BridgeName is the bridge device inside the node namespace.
	BridgeName = "cnitest0"
	// IfName is the container side's interface.
	IfName     = "eth0"
	cniVersion = "1.0.0"
)

// Node is a network namespace standing in for a node, with a bridge network.
type Node struct {
	*Namespace
	// Subnet is the network's /24 in 10.0.0.0/8, picked at random so
	// concurrent tests' networks differ; Gateway is the bridge's address.
	Subnet  *net.IPNet
	Gateway net.IP
	// BinDir holds the plugins; ConfDir the network's config list (and
	// nothing else), as containerd's CRI plugin reads it.
	BinDir, ConfDir string
	// ConfList is the network's config list.
	ConfList []byte

	dir      string
	conflist *libcni.NetworkConfigList
	loopback *libcni.PluginConfig
	cni      *libcni.CNIConfig
}

// New makes a node namespace (loopback up) and its bridge network's
// config, with the plugins in binDir. The namespace, the network's state
// and every attachment are removed by t's Cleanup.
func New(t testing.TB, binDir string) *Node {
	t.Helper()
	for _, p := range Plugins {
		if _, err := os.Stat(filepath.Join(binDir, p)); err != nil {
			t.Fatalf("CNI plugin %s missing in %s (make build): %v", p, binDir, err)
		}
	}
	n := &Node{Namespace: NewNamespace(t), BinDir: binDir, dir: t.TempDir()}
	n.ConfDir = filepath.Join(n.dir, "net.d")
	if err := n.configure(); err != nil {
		t.Fatal(err)
	}
	if err := n.Do(setLoopbackUp); err != nil {
		t.Fatalf("node namespace: %v", err)
	}
	n.cni = libcni.NewCNIConfigWithCacheDir([]string{binDir}, filepath.Join(n.dir, "cache"), nil)
	return n
}

// configure picks the subnet and writes the network's config list.
func (n *Node) configure() error {
	var b [2]byte
	_, _ = rand.Read(b[:])
	n.Subnet = &net.IPNet{IP: net.IPv4(10, 1+b[0]%254, b[1], 0).To4(), Mask: net.CIDRMask(24, 32)}
	n.Gateway = net.IPv4(10, n.Subnet.IP[1], n.Subnet.IP[2], 1).To4()
	list := map[string]any{
		"cniVersion": cniVersion,
		"name":       NetworkName,
		"plugins": []map[string]any{{
			"type": "bridge", "bridge": BridgeName, "isGateway": true, "ipMasq": false, "hairpinMode": true,
			"ipam": map[string]any{
				"type":    "host-local",
				"ranges":  [][]map[string]string{{{"subnet": n.Subnet.String(), "gateway": n.Gateway.String()}}},
				"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
				"dataDir": filepath.Join(n.dir, "ipam"),
			},
		}},
	}
	var err error
	if n.ConfList, err = json.MarshalIndent(list, "", "  "); err != nil {
		return fmt.Errorf("encode CNI config: %w", err)
	}
	if n.conflist, err = libcni.NetworkConfFromBytes(n.ConfList); err != nil {
		return fmt.Errorf("parse CNI config: %w", err)
	}
	lo := fmt.Appendf(nil, `{"cniVersion": %q, "name": "cnitest-lo", "type": "loopback"}`, cniVersion)
	if n.loopback, err = libcni.NetworkPluginConfFromBytes(lo); err != nil {
		return fmt.Errorf("parse loopback config: %w", err)
	}
	if err := os.MkdirAll(n.ConfDir, 0o755); err != nil {
		return fmt.Errorf("create CNI conf dir: %w", err)
	}
	if err := os.WriteFile(filepath.Join(n.ConfDir, "10-"+NetworkName+".conflist"), n.ConfList, 0o644); err != nil {
		return fmt.Errorf("write CNI config: %w", err)
	}
	return nil
}

// Namespace is a network namespace the test made, bind-mounted at Path.
type Namespace struct {
	// Path is the namespace's bind mount (under /var/run/netns), for
	// nsenter --net, ctr run --with-ns network:PATH and CNI_NETNS.
	Path string
	ns   ns.NetNS
}

// NewNamespace makes a fresh network namespace (only lo, down), removed by
// t's Cleanup.
func NewNamespace(t testing.TB) *Namespace {
	t.Helper()
	netns, err := testutils.NewNS()
	if err != nil {
		t.Fatalf("create network namespace: %v", err)
	}
	t.Cleanup(func() {
		netns.Close()
		if err := testutils.UnmountNS(netns); err != nil {
			t.Errorf("remove network namespace: %v", err)
		}
	})
	return &Namespace{Path: netns.Path(), ns: netns}
}

// Do runs fn with its goroutine's thread in the namespace: sockets it
// opens and processes it starts belong to the namespace.
func (s *Namespace) Do(fn func() error) error {
	return s.ns.Do(func(ns.NetNS) error { return fn() })
}

func setLoopbackUp() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	return nil
}

// invoke runs a CNI operation with the plugins running in the node
// namespace, so the bridge and the veths' host ends are made there.
func (n *Node) invoke(ctx context.Context, op func(context.Context) error) error {
	return n.Do(func() error { return op(ctx) })
}
