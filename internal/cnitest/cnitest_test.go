package cnitest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

func binDir(t *testing.T) string {
	t.Helper()
	testenv.RequireRoot(t)
	for _, p := range Plugins {
		testenv.Bin(t, filepath.Join("cni", p))
	}
	return filepath.Join(testenv.RepoRoot(), "bin", "cni")
}

// TestNetwork attaches two containers to a node's bridge: each gets its own
// address in the node's subnet, the node reaches both (ping, HTTP to a
// server listening inside one), they reach each other, and the bridge is in
// the node's namespace, not the test's. Afterwards nothing is left.
func TestNetwork(t *testing.T) {
	bin := binDir(t)
	var paths []string
	t.Run("attach", func(t *testing.T) {
		node := New(t, bin)
		a, b := node.Attach(t, "a"), node.Attach(t, "b")
		paths = append(paths, node.Path, a.Path, b.Path)
		for _, c := range []*Attachment{a, b} {
			if !node.Subnet.Contains(c.IP) || c.Net.String() != node.Subnet.String() {
				t.Fatalf("%s got %s in %s, want an address in %s", c.ID, c.IP, c.Net, node.Subnet)
			}
			if err := node.Ping(t.Context(), c.IP); err != nil {
				t.Fatalf("node → %s: %v", c.ID, err)
			}
			if mac := linkMAC(t, c.Namespace, IfName); mac != c.MAC {
				t.Fatalf("%s's %s has MAC %s, the result says %s", c.ID, IfName, mac, c.MAC)
			}
		}
		if a.IP.Equal(b.IP) {
			t.Fatalf("both containers got %s", a.IP)
		}
		if err := a.Ping(t.Context(), b.IP); err != nil {
			t.Fatalf("a → b: %v", err)
		}
		serve(t, a.Namespace, "hello from a")
		body, err := node.HTTPGet(t.Context(), fmt.Sprintf("http://%s/", net.JoinHostPort(a.IP.String(), "8080")))
		if err != nil || body != "hello from a" {
			t.Fatalf("node GET a: %q, %v; want the server's greeting", body, err)
		}
		if _, err := netlink.LinkByName(BridgeName); err == nil {
			t.Fatalf("bridge %s is in the test's own namespace", BridgeName)
		}
		if err := node.Do(func() error { _, err := netlink.LinkByName(BridgeName); return err }); err != nil {
			t.Fatalf("bridge %s not in the node namespace: %v", BridgeName, err)
		}
		if conf, err := os.ReadFile(filepath.Join(node.ConfDir, "10-"+NetworkName+".conflist")); err != nil || string(conf) != string(node.ConfList) {
			t.Fatalf("conf dir holds %q (%v), want the config list", conf, err)
		}
	})
	for _, p := range paths {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("namespace %s left after cleanup (lstat: %v)", p, err)
		}
	}
}

// TestPingUnreachable: a ping to an address on the network that nobody
// has fails.
func TestPingUnreachable(t *testing.T) {
	node := New(t, binDir(t))
	node.Attach(t, "only")
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	nobody := net.IPv4(10, node.Subnet.IP[1], node.Subnet.IP[2], 250)
	if err := node.Ping(ctx, nobody); err == nil || !strings.Contains(err.Error(), "no reply") {
		t.Fatalf("ping %s = %v, want no reply", nobody, err)
	}
}

func linkMAC(t *testing.T, ns *Namespace, name string) string {
	t.Helper()
	var mac string
	if err := ns.Do(func() error {
		l, err := netlink.LinkByName(name)
		if err == nil {
			mac = l.Attrs().HardwareAddr.String()
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return mac
}

// serve answers HTTP on :8080 inside ns until the test ends.
func serve(t *testing.T, ns *Namespace, greeting string) {
	t.Helper()
	l, err := ns.Listen("tcp4", ":8080")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, greeting)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
}
