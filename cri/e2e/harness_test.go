// Package e2e is the CRI tier: containerd v2.4.2 with its CRI plugin and the
// CNI plugins bridge, host-local and loopback, running inside a network
// namespace the test made, driven by crictl v1.37.0, with a pause image and
// a busybox image the test builds (no registry). TestRunc* run pods with the
// runc handler (Debian runc, containerd-shim-runc-v2) and prove the harness;
// TestCocoon* run them with the cocoon handler (issue 10's acceptance):
//
//	go test -count=1 -run 'TestRunc' ./cri/e2e/
//	go test -count=1 -run 'TestCocoon' ./cri/e2e/
package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/cnitest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testimage"
)

// The images the tests build and import.
const (
	pauseRef   = "localhost/cri-e2e/pause:1"
	busyboxRef = "localhost/cri-e2e/busybox:1"
)

// images are the pause and busybox images, built once per test binary.
var images struct {
	once                 sync.Once
	dir                  string
	pauseTar, busyboxTar string // their archives
	busybox              *testimage.BusyboxImage
	err                  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, dir := range []string{images.dir, chain.dir} {
		if dir != "" {
			os.RemoveAll(dir)
		}
	}
	os.Exit(code)
}

// ociImages builds the pause and busybox images' archives, once.
func ociImages(t testing.TB) {
	t.Helper()
	testenv.LookPath(t, testimage.DefaultBusybox)
	images.once.Do(func() {
		if images.dir, images.err = os.MkdirTemp("", "cri-e2e-"); images.err != nil {
			return
		}
		ctx := context.Background()
		pause, err := testimage.Pause(ctx, pauseRef, images.dir)
		if err != nil {
			images.err = err
			return
		}
		images.busybox, err = testimage.Busybox(testimage.BusyboxOptions{Name: busyboxRef, Layers: 2})
		if err != nil {
			images.err = err
			return
		}
		images.pauseTar = filepath.Join(images.dir, "pause.tar")
		images.busyboxTar = filepath.Join(images.dir, "busybox.tar")
		if images.err = testimage.WriteArchiveFile(ctx, images.pauseTar, pause); images.err != nil {
			return
		}
		images.err = testimage.WriteArchiveFile(ctx, images.busyboxTar, images.busybox.Image)
	})
	if images.err != nil {
		t.Fatal(images.err)
	}
}

// node is a test node: a network namespace with a CNI bridge network and a
// containerd with CRI running in it.
type node struct {
	t     testing.TB
	net   *cnitest.Node
	stack *devstack.Stack
	// configs holds the pod and container configs crictl reads.
	configs string
}

// nodeOptions shape a node.
type nodeOptions struct {
	// sandboxSnapshotters: see devstack.CRI; both overlayfs and cocoon
	// when nil.
	sandboxSnapshotters []string
	// cocoonConfig is the cocoon handler's config.toml.
	cocoonConfig string
	// handlers are runtime handlers beyond runc and cocoon.
	handlers []devstack.Handler
}

// startNode starts a node with the images imported: pause as the sandbox
// image (unpacked into opts.sandboxSnapshotters) and busybox, unpacked
// into overlayfs.
func startNode(t testing.TB, opts nodeOptions) *node {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.LookPath(t, "runc")
	testenv.LookPath(t, "nsenter")
	bin := filepath.Dir(testenv.Bin(t, "containerd"))
	for _, name := range []string{"ctr", "crictl", "containerd-shim-runc-v2", "cocoon-snapshotter", "containerd-shim-cocoon-v2", "cocoon-shim-server"} {
		testenv.Bin(t, name)
	}
	ociImages(t)
	cfg, err := config.ParseOver(devstack.Unpooled(), []byte(opts.cocoonConfig))
	if err != nil {
		t.Fatalf("cocoon config: %v", err)
	}
	n := &node{t: t, net: cnitest.New(t, filepath.Join(bin, "cni")), configs: t.TempDir()}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n.stack, err = devstack.Start(ctx, devstack.Options{
		BinDir: bin, Config: &cfg, LogLevel: "debug",
		CRI: &devstack.CRI{
			NetNS: n.net.Path, CNIBinDir: n.net.BinDir, CNIConfDir: n.net.ConfDir,
			SandboxArchive: images.pauseTar, SandboxImage: pauseRef,
			SandboxSnapshotters: opts.sandboxSnapshotters, Handlers: opts.handlers,
		},
	})
	if err != nil {
		t.Fatalf("start containerd with CRI: %v", err)
	}
	t.Cleanup(n.close)
	if err := n.stack.Import(ctx, images.busyboxTar, devstack.Overlayfs); err != nil {
		t.Fatal(err)
	}
	return n
}

// close tears the node's containerd down and checks it left nothing.
func (n *node) close() {
	dir := n.stack.Dir
	if n.t.Failed() {
		n.t.Log(n.stack.Logs())
	}
	if err := n.stack.Close(); err != nil {
		n.t.Errorf("tear down containerd: %v", err)
	}
	if left := devstack.Leftovers(dir); len(left) > 0 {
		n.t.Errorf("the node's containerd left:\n%s", strings.Join(left, "\n"))
	}
}

// crictl runs crictl and fails t on error.
func (n *node) crictl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := n.crictlErr(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// crictlErr runs crictl with a timeout.
func (n *node) crictlErr(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := n.stack.Crictl(ctx, args...)
	return strings.TrimSpace(out), err
}

// waitIdle waits until the node's containerd holds no shim, VM, pod
// process, mount or pod cgroup (devstack.Stack.InUse), and fails the test
// with what is left otherwise.
func (n *node) waitIdle(t testing.TB, what string) {
	t.Helper()
	n.waitIdleBut(t, what, func(string) bool { return false })
}

// waitIdleBut is waitIdle with what InUse lists and kept says is not
// what's.
func (n *node) waitIdleBut(t testing.TB, what string, kept func(line string) bool) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, what+" gone", func() error {
		if left := slices.DeleteFunc(n.stack.InUse(), kept); len(left) > 0 {
			return fmt.Errorf("left:\n%s", strings.Join(left, "\n"))
		}
		return nil
	})
}

// eventually retries check until it returns nil or 60 s pass.
func eventually(t *testing.T, what string, check func() error) {
	t.Helper()
	testenv.Eventually(t, time.Minute, what, check)
}
