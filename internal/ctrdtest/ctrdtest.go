// Package ctrdtest starts a private containerd v2.4.2 with cocoon-snapshotter
// registered as the proxy snapshotter "cocoon" and the cocoon shim on PATH,
// for tests: a testing.TB wrapper over internal/devstack.
//
//	c := ctrdtest.Start(t, ctrdtest.Options{})
//	if _, err := c.Ctr("images", "import", "--snapshotter", ctrdtest.Snapshotter, archive); err != nil {
//		t.Fatal(err)
//	}
//	img, err := c.Client().GetImage(ctx, ref)
package ctrdtest

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// Namespace is the containerd namespace the harness's ctr and client use.
const Namespace = "cocoon-test"

// Snapshotter is the proxy snapshotter's name in containerd's config.
const Snapshotter = devstack.Snapshotter

// Options adjust the private containerd.
type Options struct {
	// ExtraConfig is appended to containerd's config.toml (version 3),
	// e.g. a runtime section. It must not repeat a table the harness writes.
	ExtraConfig string
	// SnapshotterConfig is the cocoon config.toml, given to
	// cocoon-snapshotter with --config and to shims as $COCOON_CONFIG.
	// Its shim run dir and snapshotter root and address are replaced by
	// paths under Dir. It is read over devstack.Unpooled: no pooled VMs
	// unless it sets shim.pooled_vm.
	SnapshotterConfig string
	// Env is added to containerd's environment (and so the shims').
	Env []string
}

// Containerd is a running private containerd and cocoon-snapshotter.
type Containerd struct {
	*devstack.Stack
	t testing.TB
}

// Start starts cocoon-snapshotter and containerd, waits until both serve,
// and registers Cleanup with t. It needs root and `make build`.
func Start(t testing.TB, opts Options) *Containerd {
	t.Helper()
	testenv.RequireRoot(t)
	bin := filepath.Dir(testenv.Bin(t, "containerd"))
	for _, name := range []string{"ctr", "cocoon-snapshotter", "containerd-shim-cocoon-v2", "cocoon-shim-server"} {
		testenv.Bin(t, name)
	}
	cfg, err := config.ParseOver(devstack.Unpooled(), []byte(opts.SnapshotterConfig))
	if err != nil {
		t.Fatalf("cocoon config: %v", err)
	}
	s, err := devstack.Start(context.Background(), devstack.Options{
		BinDir: bin, Namespace: Namespace, Config: &cfg, ExtraConfig: opts.ExtraConfig, Env: opts.Env,
	})
	if err != nil {
		t.Fatalf("start containerd: %v", err)
	}
	c := &Containerd{Stack: s, t: t}
	t.Cleanup(c.Cleanup)
	return c
}

// Ctr runs ctr against this containerd in Namespace and returns its
// stdout; the error carries stderr.
func (c *Containerd) Ctr(args ...string) (string, error) {
	return c.Stack.Ctr(context.Background(), args...)
}

// Restart stops containerd and starts it again on the same dirs
// (devstack.Stack.Restart); the shims keep running.
func (c *Containerd) Restart() {
	c.t.Helper()
	if err := c.Stack.Restart(context.Background()); err != nil {
		c.t.Fatalf("restart containerd: %v", err)
	}
}

// Client returns a containerd Go client in Namespace, closed by Cleanup.
func (c *Containerd) Client() *client.Client {
	c.t.Helper()
	cl, err := c.Stack.Client()
	if err != nil {
		c.t.Fatal(err)
	}
	return cl
}

// Cleanup tears the stack down (devstack.Stack.Close), reporting what it
// could not clean as test errors and, if the test failed, the daemons'
// logs. Start registers it with t; calling it again is a no-op.
func (c *Containerd) Cleanup() {
	if c.Dir == "" {
		return
	}
	if c.t.Failed() {
		c.t.Log(c.Logs())
	}
	if err := c.Close(); err != nil {
		c.t.Errorf("tear down containerd: %v", err)
	}
}

// Leftovers describes what a torn-down harness left behind in dir (its Dir
// before Cleanup): processes, mounts or the dir itself. Empty means clean.
func Leftovers(dir string) []string { return devstack.Leftovers(dir) }

// CollectGarbage runs containerd's garbage collection to the end: deleted
// containers' snapshots are then gone from the snapshotter too. (Deleting a
// lease synchronously runs a collection and waits for it.)
func (c *Containerd) CollectGarbage() {
	c.t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), Namespace)
	ls := c.Client().LeasesService()
	l, err := ls.Create(ctx, leases.WithRandomID())
	if err != nil {
		c.t.Fatalf("collect garbage: %v", err)
	}
	if err := ls.Delete(ctx, l, leases.SynchronousDelete); err != nil {
		c.t.Fatalf("collect garbage: %v", err)
	}
}
