package critest_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/distribution/reference"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/cnitest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testimage"
	"github.com/cocoonstack/containerd-shim-cocoon/restore"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/vm"
)

// registryAddr is where the node's registry listens, inside the node's
// network namespace: no other address is reached.
const registryAddr = "127.0.0.1:5000"

// restoreConfig restores ordinary images' VMs from the chain image.
const restoreConfig = `
[restore]
base_image = "` + chainRef + `"
`

// podVMConfig gives each pod one VM restored from the chain image, which
// every container of the pod joins (issue 21); containerVMConfig each
// container a VM of its own.
const (
	podVMConfig = restoreConfig + `
[shim]
pod_vm = "pod"
`
	containerVMConfig = restoreConfig + `
[shim]
pod_vm = "container"
`
)

// node is a network namespace with a CNI bridge, a registry serving
// critest's images and mirroring every registry critest pulls from, and a
// containerd with CRI (runc and cocoon handlers) and NRI, all inside it.
type node struct {
	net       *cnitest.Node
	stack     *devstack.Stack
	nriSocket string
}

// startNode starts a node for handler's critest run: the cocoon handler's
// node also has the chain image in the cocoon snapshotter.
func startNode(t *testing.T, handler string) *node {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.LookPath(t, "runc")
	testenv.LookPath(t, "nsenter")
	bin := filepath.Dir(testenv.Bin(t, "containerd"))
	for _, name := range []string{"ctr", "crictl", "crane", "critest", "containerd-shim-runc-v2", "cocoon-snapshotter", "containerd-shim-cocoon-v2", "cocoon-shim-server"} {
		testenv.Bin(t, name)
	}
	var chain string
	if handler == devstack.CocoonHandler {
		chain = chainImage(t)
	}
	images(t)
	n := &node{net: cnitest.New(t, filepath.Join(bin, "cni"))}
	dir := t.TempDir()
	n.nriSocket = filepath.Join(dir, "nri.sock")
	startRegistry(t, n.net, bin)
	hosts := writeHosts(t, dir)
	body := podVMConfig
	if *containerVM {
		body = containerVMConfig
	}
	cfg, err := config.Parse([]byte(body))
	if err != nil {
		t.Fatalf("cocoon config: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	n.stack, err = devstack.Start(ctx, devstack.Options{
		BinDir: bin, Config: &cfg, LogLevel: "info",
		CRI: &devstack.CRI{
			NetNS: n.net.Path, CNIBinDir: n.net.BinDir, CNIConfDir: n.net.ConfDir,
			SandboxArchive: built.pauseTar, SandboxImage: pauseRef,
			RegistryConfigPath: hosts, NRISocket: n.nriSocket,
		},
	})
	if err != nil {
		t.Fatalf("start containerd with CRI: %v", err)
	}
	t.Cleanup(func() { n.close(t) })
	if chain != "" {
		if err := n.stack.Import(ctx, chain, devstack.Snapshotter); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// close tears the node's containerd down and checks it left nothing.
func (n *node) close(t *testing.T) {
	dir := n.stack.Dir
	n.checkPoolUse(t)
	if err := n.stack.Close(); err != nil {
		t.Errorf("tear down containerd: %v", err)
	}
	if left := devstack.Leftovers(dir); len(left) > 0 {
		t.Errorf("the node's containerd left:\n%s", strings.Join(left, "\n"))
	}
}

// checkPoolUse logs how many of the run's VMs were claimed from the pool
// (shim.pooled_vm, on in the cocoon handler's config as by default) and
// how many restored on their task's path; a whole run that claimed none
// did not judge the pooled path.
func (n *node) checkPoolUse(t *testing.T) {
	kinds := map[string]string{} // a task's report is logged again as it grows
	for _, line := range strings.Split(n.stack.Logs(), "\n") {
		id := logField(line, "id")
		if !strings.Contains(line, `msg="restore report"`) || id == "" {
			continue
		}
		switch {
		case strings.Contains(line, " phase."+vm.PhaseClaim+"="):
			kinds[id] = vm.PhaseClaim
		case strings.Contains(line, " phase."+restore.PhaseResume+"="):
			kinds[id] = restore.PhaseResume
		}
	}
	claimed, restored := 0, 0
	for _, k := range kinds {
		if k == vm.PhaseClaim {
			claimed++
		} else {
			restored++
		}
	}
	if claimed+restored == 0 {
		return
	}
	t.Logf("VMs claimed from the pool: %d; restored on their task's path: %d", claimed, restored)
	if *focus == "" && claimed == 0 {
		t.Error("no VM was claimed from the pool: the default config's pooled VMs went unused")
	}
}

// logField is the value of key in a logfmt line, "" without one.
func logField(line, key string) string {
	_, v, ok := strings.Cut(line, " "+key+"=")
	if !ok {
		return ""
	}
	v, _, _ = strings.Cut(v, " ")
	return v
}

// startRegistry runs crane's registry in ns, waits until it serves and
// pushes critest's images into it, each under its reference's path.
func startRegistry(t *testing.T, ns *cnitest.Node, bin string) {
	t.Helper()
	crane := filepath.Join(bin, "crane")
	cmd := exec.Command("nsenter", "--net="+ns.Path, "--", crane, "registry", "serve", "--address", registryAddr)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the registry: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	testenv.Eventually(t, 30*time.Second, "the registry serving on "+registryAddr, func() error {
		c, err := ns.Dial(context.Background(), "tcp", registryAddr)
		if err == nil {
			c.Close()
		}
		return err
	})
	for name, layout := range built.layouts {
		ref, err := mirrored(name)
		if err != nil {
			t.Fatal(err)
		}
		push := exec.Command("nsenter", "--net="+ns.Path, "--", crane, "push", "--insecure", layout, ref)
		if out, err := push.CombinedOutput(); err != nil {
			t.Fatalf("push %s as %s: %v: %s", name, ref, err, out)
		}
	}
}

// mirrored is where the registry serves name: its path and tag, at
// registryAddr, as containerd asks a mirror for it.
func mirrored(name string) (string, error) {
	named, err := reference.ParseNormalizedNamed(name)
	if err != nil {
		return "", fmt.Errorf("image %q: %w", name, err)
	}
	tagged, ok := named.(reference.Tagged)
	if !ok {
		return "", fmt.Errorf("image %q: no tag: want one", name)
	}
	return registryAddr + "/" + reference.Path(named) + ":" + tagged.Tag(), nil
}

// writeHosts writes containerd's registry hosts dir under dir: every
// registry critest pulls from is served by the node's registry.
func writeHosts(t *testing.T, dir string) string {
	t.Helper()
	hosts := filepath.Join(dir, "hosts")
	for _, reg := range testimage.CritestRegistries {
		if err := os.MkdirAll(filepath.Join(hosts, reg), 0o755); err != nil {
			t.Fatal(err)
		}
		body := fmt.Sprintf("server = %q\n", "http://"+registryAddr)
		if err := os.WriteFile(filepath.Join(hosts, reg, "hosts.toml"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return hosts
}
