package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/cnitest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/ctrdtest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// httpdScript serves the guest's hostname and MAC over HTTP on port 80.
const httpdScript = `mkdir -p /www && { hostname; cat /sys/class/net/eth0/address; } > /www/index.html && exec httpd -f -p 80 -h /www`

// cniNode is a node namespace with a CNI bridge network (the plugins make
// build installs), for tasks to join.
func cniNode(t *testing.T) *cnitest.Node {
	t.Helper()
	return cnitest.New(t, filepath.Join(filepath.Dir(testenv.Bin(t, "containerd")), "cni"))
}

// serve runs the test image's httpd in a VM joined to a's namespace.
func serve(t *testing.T, c *ctrdtest.Containerd, a *cnitest.Attachment) {
	t.Helper()
	if _, err := run(c, []string{"-d", "--with-ns", "network:" + a.Path}, a.ID, "sh", "-c", httpdScript); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = c.Ctr("task", "kill", "-s", "SIGKILL", a.ID)
		_, _ = c.Ctr("task", "delete", "-f", a.ID)
		_, _ = c.Ctr("containers", "delete", a.ID)
	})
}

// get fetches the task's page from the node, waiting for httpd to listen:
// the task is running when ctr returns, its server a moment later.
func get(t *testing.T, from *cnitest.Namespace, a *cnitest.Attachment) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		body, err := from.HTTPGet(ctx, "http://"+a.IP.String()+"/")
		if err == nil {
			return body
		}
		select {
		case <-ctx.Done():
			t.Fatalf("GET http://%s/ from the node: %v", a.IP, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// TestNetworkHTTP: a VM in a namespace CNI set up answers HTTP from the
// node at the container's address, wearing the namespace interface's MAC,
// and reaches its gateway.
func TestNetworkHTTP(t *testing.T) {
	c := stack(t, "")
	node := cniNode(t)
	a := node.Attach(t, "web")
	serve(t, c, a)
	body := get(t, node.Namespace, a)
	if want := "web\n" + a.MAC + "\n"; body != want {
		t.Fatalf("page %q, want the hostname and the namespace interface's MAC %q", body, want)
	}
	out, err := c.Ctr("task", "exec", "--exec-id", "ping", a.ID, "ping", "-c", "1", "-W", "5", node.Gateway.String())
	if err != nil {
		t.Fatalf("ping the gateway from the guest: %v\n%s", err, out)
	}
}

// TestNetworkClones: eight clones of one snapshot at once, each in its own
// namespace, each reachable at its own address with its own MAC.
func TestNetworkClones(t *testing.T) {
	c := stack(t, "")
	node := cniNode(t)
	const n = 8
	as := make([]*cnitest.Attachment, n)
	for i := range as {
		as[i] = node.Attach(t, fmt.Sprintf("clone%d", i))
	}
	var wg sync.WaitGroup
	for _, a := range as {
		wg.Add(1)
		go func() {
			defer wg.Done()
			serve(t, c, a)
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for _, a := range as {
		if body, want := get(t, node.Namespace, a), a.ID+"\n"+a.MAC+"\n"; body != want {
			t.Errorf("%s at %s answered %q, want %q", a.ID, a.IP, body, want)
		}
	}
}

// TestNoNetworkNamespace: a task that shares the runtime's namespace
// (--net-host) runs as before: its VM's NIC stays down and nothing is
// made for it on the host.
func TestNoNetworkNamespace(t *testing.T) {
	c := stack(t, "")
	out, err := run(c, []string{"--rm", "--net-host"}, "nohost", "sh", "-c", "cat /sys/class/net/eth0/operstate; ip -4 addr show eth0 | grep -c inet || true")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(out); len(got) != 2 || got[0] != "down" || got[1] != "0" {
		t.Fatalf("guest NIC state and address count %q, want down and 0", out)
	}
}
