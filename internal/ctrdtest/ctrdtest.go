// Package ctrdtest starts a private containerd v2.4.2 with cocoon-snapshotter
// registered as the proxy snapshotter "cocoon", for tests. Everything lives
// under one short temp dir; Cleanup stops only the processes it started (and
// the shims and VMs they started, found by that dir) and removes every
// mount, socket and file it made.
//
//	c := ctrdtest.Start(t, ctrdtest.Options{})
//	if _, err := c.Ctr("images", "import", "--snapshotter", ctrdtest.Snapshotter, archive); err != nil {
//		t.Fatal(err)
//	}
//	img, err := c.Client().GetImage(ctx, ref)
package ctrdtest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"text/template"
	"time"

	"github.com/containerd/containerd/v2/client"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// Namespace is the containerd namespace the harness's ctr and client use.
const Namespace = "cocoon-test"

// Snapshotter is the proxy snapshotter's name in containerd's config.
const Snapshotter = "cocoon"

// Options adjust the private containerd.
type Options struct {
	// ExtraConfig is appended to containerd's config.toml (version 3),
	// e.g. a [plugins."io.containerd.cri.v1.runtime"...] or runtime section.
	// It must not repeat a table the harness writes (see configTemplate).
	ExtraConfig string
	// SnapshotterConfig is the cocoon config.toml given to
	// cocoon-snapshotter with --config (e.g. a [snapshotter] flat_cache_size).
	// Its root and address are overridden by the harness.
	SnapshotterConfig string
	// Env is added to containerd's environment (and so the shims'). bin/ is
	// put first on PATH so containerd finds containerd-shim-cocoon-v2.
	Env []string
}

// Containerd is a running private containerd and cocoon-snapshotter.
type Containerd struct {
	Dir                string // the temp dir holding everything below
	Address            string // containerd's gRPC socket
	Root, State        string // containerd's root and state dirs
	FifoDir            string // for ctr --fifo-dir
	SnapshotterRoot    string // cocoon-snapshotter --root
	SnapshotterAddress string // cocoon-snapshotter --address

	t      testing.TB
	ctr    string
	procs  []*proc
	client *client.Client
}

type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// Start starts cocoon-snapshotter and containerd, waits until both serve,
// and registers Cleanup with t. It needs root and `make build`.
func Start(t testing.TB, opts Options) *Containerd {
	t.Helper()
	testenv.RequireRoot(t)
	containerd := testenv.Bin(t, "containerd")
	snapshotter := testenv.Bin(t, "cocoon-snapshotter")
	c := &Containerd{t: t, ctr: testenv.Bin(t, "ctr")}
	// /tmp, not t.TempDir(): the shim socket dir must stay within 42 bytes.
	dir, err := os.MkdirTemp("/tmp", "ctrd-")
	if err != nil {
		t.Fatalf("create containerd temp dir: %v", err)
	}
	c.Dir = dir
	t.Cleanup(c.Cleanup)
	c.Address = filepath.Join(dir, "c.sock")
	c.Root, c.State = filepath.Join(dir, "root"), filepath.Join(dir, "state")
	c.FifoDir = filepath.Join(dir, "fifo")
	c.SnapshotterRoot, c.SnapshotterAddress = filepath.Join(dir, "sn"), filepath.Join(dir, "sn.sock")
	if err := os.MkdirAll(c.FifoDir, 0o700); err != nil {
		t.Fatalf("create fifo dir: %v", err)
	}

	snCfg := c.writeFile("cocoon.toml", opts.SnapshotterConfig)
	c.start(snapshotter, nil, "--config", snCfg, "--root", c.SnapshotterRoot,
		"--address", c.SnapshotterAddress, "--log-level", "debug")
	c.waitSocket(c.SnapshotterAddress)

	ctrdCfg := c.writeFile("containerd.toml", c.config(opts.ExtraConfig))
	env := append([]string{"PATH=" + filepath.Join(testenv.RepoRoot(), "bin") + ":" + os.Getenv("PATH")}, opts.Env...)
	c.start(containerd, env, "--config", ctrdCfg)
	c.waitSocket(c.Address)
	if _, err := c.Ctr("version"); err != nil {
		t.Fatalf("containerd does not answer: %v", err)
	}
	return c
}

// Ctr runs bin/ctr against this containerd in Namespace and returns its
// stdout; the error carries stderr.
func (c *Containerd) Ctr(args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(c.ctr, append([]string{"--address", c.Address, "--namespace", Namespace}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// Client returns a containerd Go client in Namespace, closed by Cleanup.
func (c *Containerd) Client() *client.Client {
	c.t.Helper()
	if c.client == nil {
		cl, err := client.New(c.Address, client.WithDefaultNamespace(Namespace))
		if err != nil {
			c.t.Fatalf("connect to containerd: %v", err)
		}
		c.client = cl
	}
	return c.client
}

// Logs returns what containerd and the snapshotter have logged so far.
func (c *Containerd) Logs() string {
	var b strings.Builder
	for _, p := range c.procs {
		data, _ := os.ReadFile(p.log)
		fmt.Fprintf(&b, "==== %s ====\n%s\n", p.name, data)
	}
	return b.String()
}

const configTemplate = `version = 3
root = "{{.Root}}"
state = "{{.State}}"
disabled_plugins = [
  "io.containerd.grpc.v1.cri",
  "io.containerd.cri.v1.images",
  "io.containerd.cri.v1.runtime",
  "io.containerd.podsandbox.controller.v1.podsandbox",
  "io.containerd.nri.v1.nri",
]

[grpc]
  address = "{{.Address}}"

[ttrpc]
  address = "{{.Address}}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{{.Dir}}/opt"

[plugins."io.containerd.shim.v1.manager"]
  socket_dir = "{{.Dir}}/s"

[plugins."io.containerd.transfer.v1.local"]
  unpack_config = [{ platform = "linux/amd64", snapshotter = "cocoon" }]

[proxy_plugins.cocoon]
  type = "snapshot"
  address = "{{.SnapshotterAddress}}"
`

func (c *Containerd) config(extra string) string {
	var b strings.Builder
	if err := template.Must(template.New("config").Parse(configTemplate)).Execute(&b, c); err != nil {
		c.t.Fatalf("render containerd config: %v", err)
	}
	return b.String() + "\n" + extra
}

func (c *Containerd) writeFile(name, data string) string {
	p := filepath.Join(c.Dir, name)
	if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
		c.t.Fatalf("write %s: %v", name, err)
	}
	return p
}

// start runs bin with its output in a log file under Dir.
func (c *Containerd) start(bin string, env []string, args ...string) {
	name := filepath.Base(bin)
	logPath := filepath.Join(c.Dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		c.t.Fatalf("create %s log: %v", name, err)
	}
	defer f.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	c.procs = append(c.procs, p)
}

// waitSocket waits until the last started process listens on path.
func (c *Containerd) waitSocket(path string) {
	c.t.Helper()
	p := c.procs[len(c.procs)-1]
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if fi, err := os.Stat(path); err == nil && fi.Mode().Type() == os.ModeSocket {
			return
		}
		select {
		case <-p.done:
			c.t.Fatalf("%s exited before serving %s:\n%s", p.name, path, c.Logs())
		case <-time.After(20 * time.Millisecond):
		}
	}
	c.t.Fatalf("%s did not serve %s within 30s:\n%s", p.name, path, c.Logs())
}
