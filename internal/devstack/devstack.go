// Package devstack starts a private containerd v2.4.2 with cocoon-snapshotter
// registered as the proxy snapshotter "cocoon" and the cocoon shim on PATH,
// for the demo, the benchmark and the end-to-end tests; with Options.CRI
// also its CRI plugin (runc and cocoon runtime handlers, CNI), running
// inside a network namespace the caller made, driven by crictl. Everything
// lives under one short temp dir; Close stops only the processes it started
// (and the shims, VMs and pods they started, found by that dir and the
// cgroup parent named after it) and removes every mount, socket and file
// it made.
//
//	s, err := devstack.Start(ctx, devstack.Options{BinDir: "bin"})
//	if err != nil { ... }
//	defer s.Close()
//	out, err := s.Ctr(ctx, "images", "import", "--snapshotter", devstack.Snapshotter, archive)
package devstack

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"text/template"

	"github.com/containerd/containerd/v2/client"
	"github.com/pelletier/go-toml/v2"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
)

const (
	// DefaultNamespace is the containerd namespace ctr and the client use
	// when Options.Namespace is empty.
	DefaultNamespace = "cocoon"
	// Snapshotter is the proxy snapshotter's name in containerd's config.
	Snapshotter = "cocoon"
	// Runtime is the cocoon runtime type; containerd resolves it to
	// containerd-shim-cocoon-v2 on PATH.
	Runtime = "io.containerd.cocoon.v2"
	// dirPrefix keeps the shim socket dir within containerd's 42-byte limit.
	dirPrefix = "ctrd-"
)

// Options adjust the private containerd.
type Options struct {
	// BinDir holds containerd, ctr, cocoon-snapshotter and the shim's
	// launcher containerd-shim-cocoon-v2 and server cocoon-shim-server
	// (make build). It goes first on containerd's PATH so containerd finds
	// the launcher.
	BinDir string
	// Namespace for Ctr and Client; DefaultNamespace when empty.
	Namespace string
	// Config is the cocoon config.toml, given to cocoon-snapshotter with
	// --config and to the shims through $COCOON_CONFIG; config.Default()
	// when nil. Its shim run dir and snapshotter root and address are
	// replaced by paths under the stack's dir.
	Config *config.Config
	// ExtraConfig is appended to containerd's config.toml (version 3). It
	// must not repeat a table the stack writes (see containerdConfig).
	ExtraConfig string
	// Env is added to containerd's environment (and so the shims').
	Env []string
	// LogLevel of containerd and the snapshotter; "debug" when empty.
	LogLevel string
	// CRI, when set, enables containerd's CRI plugin and runs containerd
	// inside CRI.NetNS; Namespace then defaults to CRINamespace.
	CRI *CRI
	// NetNS, when set without CRI, is the network namespace containerd
	// runs in (and so where it pulls from).
	NetNS string
}

// Stack is a running private containerd and cocoon-snapshotter.
type Stack struct {
	Dir                string // the temp dir holding everything below
	Address            string // containerd's gRPC socket
	Root, State        string // containerd's root and state dirs
	FifoDir            string // for ctr --fifo-dir
	SnapshotterRoot    string // cocoon-snapshotter --root
	SnapshotterAddress string // cocoon-snapshotter --address
	ConfigPath         string // the cocoon config.toml ($COCOON_CONFIG)
	RunDir             string // the shims' [shim] run_dir
	Namespace          string
	BinDir             string
	// CgroupParent is the cgroup a CRI pod's config names as its
	// linux.cgroup_parent ("/" + the dir's name): the stack claims it and
	// removes it, and finds what is left in it.
	CgroupParent string
	// PodLogDir is a dir for the CRI pods' logs (log_directory).
	PodLogDir string

	cri    *CRI
	procs  []*proc
	client *client.Client
	// cgroups are the namespace's cgroup dirs that did not exist when
	// the stack started; Close removes those the shims left empty.
	cgroups []string
}

// Start starts cocoon-snapshotter and containerd and waits until both
// serve. On error nothing it started is left behind.
func Start(ctx context.Context, opts Options) (*Stack, error) {
	if opts.BinDir == "" {
		return nil, errors.New("start devstack: no bin dir: want the directory make build fills")
	}
	if err := checkBinaries(opts); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("start devstack: containerd and its snapshot mounts need root: run as root")
	}
	dir, err := os.MkdirTemp("/tmp", dirPrefix)
	if err != nil {
		return nil, fmt.Errorf("create stack dir: %w", err)
	}
	st := newStack(dir, opts)
	if err := st.start(ctx, opts); err != nil {
		return nil, errors.Join(err, st.Close())
	}
	return st, nil
}

// checkBinaries checks that the stack's binaries are built and, for CRI,
// that its options are complete.
func checkBinaries(opts Options) error {
	// The launcher finds its server next to it and says so if it is not
	// there; a baseline build (bench --baseline) may predate the split.
	names := []string{"containerd", "ctr", "cocoon-snapshotter", "containerd-shim-cocoon-v2"}
	if opts.CRI != nil {
		if err := opts.CRI.validate(); err != nil {
			return fmt.Errorf("start devstack: %w", err)
		}
		names = append(names, "crictl", "containerd-shim-runc-v2")
	}
	for _, name := range names {
		if _, err := os.Stat(filepath.Join(opts.BinDir, name)); err != nil {
			return fmt.Errorf("start devstack: %s missing in %s (make build): %w", name, opts.BinDir, err)
		}
	}
	return nil
}

func newStack(dir string, opts Options) *Stack {
	ns := opts.Namespace
	switch {
	case ns != "":
	case opts.CRI != nil:
		ns = CRINamespace
	default:
		ns = DefaultNamespace
	}
	bin, _ := filepath.Abs(opts.BinDir)
	return &Stack{
		Dir:                dir,
		Address:            filepath.Join(dir, "c.sock"),
		Root:               filepath.Join(dir, "root"),
		State:              filepath.Join(dir, "state"),
		FifoDir:            filepath.Join(dir, "fifo"),
		SnapshotterRoot:    filepath.Join(dir, "sn"),
		SnapshotterAddress: filepath.Join(dir, "sn.sock"),
		ConfigPath:         filepath.Join(dir, "cocoon.toml"),
		RunDir:             filepath.Join(dir, "run"),
		Namespace:          ns,
		BinDir:             bin,
		CgroupParent:       "/" + filepath.Base(dir),
		PodLogDir:          filepath.Join(dir, "pods"),
		cri:                opts.CRI,
		cgroups:            absentCgroups(ns),
	}
}

func (s *Stack) start(ctx context.Context, opts Options) error {
	level := opts.LogLevel
	if level == "" {
		level = "debug"
	}
	if err := os.MkdirAll(s.FifoDir, 0o700); err != nil {
		return fmt.Errorf("create fifo dir: %w", err)
	}
	if err := s.writeCocoonConfig(opts.Config); err != nil {
		return err
	}
	sn, err := s.spawn("cocoon-snapshotter", nil, nil, "--config", s.ConfigPath, "--root", s.SnapshotterRoot,
		"--address", s.SnapshotterAddress, "--log-level", level)
	if err != nil {
		return err
	}
	if err := s.waitSocket(ctx, sn, s.SnapshotterAddress); err != nil {
		return err
	}
	ctrdCfg, err := s.containerdConfig(opts.ExtraConfig, level)
	if err != nil {
		return err
	}
	env := append([]string{
		"PATH=" + s.BinDir + ":" + os.Getenv("PATH"),
		config.EnvPath + "=" + s.ConfigPath,
	}, opts.Env...)
	netns := opts.NetNS
	if s.cri != nil {
		netns = s.cri.NetNS
	}
	var wrap []string
	if netns != "" {
		// Not ip netns exec: its private mount namespace would hide the
		// snapshotter's mounts from containerd and containerd's from us.
		wrap = []string{"nsenter", "--net=" + netns, "--"}
	}
	ctrd, err := s.spawn("containerd", wrap, env, "--config", ctrdCfg)
	if err != nil {
		return err
	}
	if err := s.waitContainerd(ctx, ctrd); err != nil {
		return err
	}
	if s.cri != nil {
		return s.startCRI(ctx)
	}
	return nil
}

// waitContainerd waits until containerd p serves.
func (s *Stack) waitContainerd(ctx context.Context, p *proc) error {
	if err := s.waitSocket(ctx, p, s.Address); err != nil {
		return err
	}
	if _, err := s.Ctr(ctx, "version"); err != nil {
		return fmt.Errorf("containerd does not answer: %w", err)
	}
	return nil
}

// Restart stops containerd and starts it again with the same config, dirs
// and environment, as a node's containerd restart does: the shims and
// their VMs keep running and the new containerd reconnects to them. The
// snapshotter keeps running. Close stops the new containerd.
func (s *Stack) Restart(ctx context.Context) error {
	p := s.containerd()
	if p == nil {
		return errors.New("restart containerd: the stack runs none")
	}
	stop(p)
	// A socket left behind would pass for the new containerd serving.
	if err := os.Remove(s.Address); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("restart containerd: remove its old socket: %w", err)
	}
	if err := s.run(p); err != nil {
		return fmt.Errorf("restart containerd: %w", err)
	}
	return s.waitContainerd(ctx, p)
}

// containerd is the stack's containerd process, nil when it runs none.
func (s *Stack) containerd() *proc {
	i := slices.IndexFunc(s.procs, func(p *proc) bool { return p.name == "containerd" })
	if i < 0 {
		return nil
	}
	return s.procs[i]
}

// ContainerdPID is the pid of the stack's containerd, 0 when it runs none.
func (s *Stack) ContainerdPID() int {
	if p := s.containerd(); p != nil && p.cmd.Process != nil {
		return p.cmd.Process.Pid
	}
	return 0
}

// Unpooled is the defaults without pooled VMs (shim.pooled_vm off): what a
// test's stack starts from unless its config turns the pool on. A pool
// restores a VM ahead of every task, which doubles a test's restores, and
// its VMs outlive the tasks whose leftovers a test counts.
func Unpooled() config.Config {
	c := config.Default()
	c.Shim.PooledVM = false
	return c
}

// writeCocoonConfig writes the cocoon config.toml with every path it names
// moved under Dir.
func (s *Stack) writeCocoonConfig(c *config.Config) error {
	cfg := config.Default()
	if c != nil {
		cfg = *c
	}
	cfg.Shim.RunDir = s.RunDir
	cfg.Shim.PoolCgroup = "/" + poolCgroup(s.Dir)
	cfg.Snapshotter.Root = s.SnapshotterRoot
	cfg.Snapshotter.Address = s.SnapshotterAddress
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("cocoon config: %w", err)
	}
	data, err := encodeChanges(cfg)
	if err != nil {
		return fmt.Errorf("encode cocoon config: %w", err)
	}
	if err := os.WriteFile(s.ConfigPath, data, 0o644); err != nil {
		return fmt.Errorf("write cocoon config: %w", err)
	}
	return nil
}

// WriteConfig writes to path the stack's cocoon config as change changes
// it: a runtime's own config (ctr --runtime-config-path) beside the one
// the shims read from $COCOON_CONFIG.
func (s *Stack) WriteConfig(path string, change func(*config.Config)) error {
	cfg, err := config.Load(s.ConfigPath)
	if err != nil {
		return err
	}
	change(&cfg)
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("cocoon config: %w", err)
	}
	data, err := encodeChanges(cfg)
	if err != nil {
		return fmt.Errorf("encode cocoon config: %w", err)
	}
	return os.WriteFile(path, data, 0o644)
}

// encodeChanges writes the keys of c that differ from the defaults: what
// the file needs, and all an older build's strict parser must know (a
// benchmark's baseline runs one).
func encodeChanges(c config.Config) ([]byte, error) {
	var have, def map[string]any
	for _, x := range []struct {
		cfg config.Config
		m   *map[string]any
	}{{c, &have}, {config.Default(), &def}} {
		data, err := toml.Marshal(x.cfg)
		if err != nil {
			return nil, err
		}
		if err := toml.Unmarshal(data, x.m); err != nil {
			return nil, err
		}
	}
	return toml.Marshal(changes(have, def))
}

// changes is what of have differs from def, table by table.
func changes(have, def map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range have {
		sub, isTable := v.(map[string]any)
		defSub, _ := def[k].(map[string]any)
		switch {
		case isTable:
			if c := changes(sub, defSub); len(c) > 0 {
				out[k] = c
			}
		case !reflect.DeepEqual(v, def[k]):
			out[k] = v
		}
	}
	return out
}

const containerdConfigTemplate = `version = 3
root = "{{.Root}}"
state = "{{.State}}"
{{- if .NRIEnabled}}
disabled_plugins = []
{{- else if .CRIEnabled}}
disabled_plugins = ["io.containerd.nri.v1.nri"]
{{- else}}
disabled_plugins = [
  "io.containerd.grpc.v1.cri",
  "io.containerd.cri.v1.images",
  "io.containerd.cri.v1.runtime",
  "io.containerd.podsandbox.controller.v1.podsandbox",
  "io.containerd.nri.v1.nri",
]
{{- end}}

[debug]
  level = "{{.Level}}"

[grpc]
  address = "{{.Address}}"

[ttrpc]
  address = "{{.Address}}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{{.Dir}}/opt"

[plugins."io.containerd.shim.v1.manager"]
  socket_dir = "{{.Dir}}/s"

# Collect garbage right after each deletion, so a removed container's
# snapshot (and the hard link it pins) goes at once, not whenever GC runs.
[plugins."io.containerd.gc.v1.scheduler"]
  deletion_threshold = 1
  schedule_delay = "0ms"

[plugins."io.containerd.transfer.v1.local"]
  unpack_config = [
    { platform = "linux/amd64", snapshotter = "{{.Snapshotter}}" },
    { platform = "linux/amd64", snapshotter = "{{.Overlayfs}}" },
  ]

[proxy_plugins.{{.Snapshotter}}]
  type = "snapshot"
  address = "{{.SnapshotterAddress}}"
`

// containerdConfig writes containerd's config.toml and returns its path.
func (s *Stack) containerdConfig(extra, level string) (string, error) {
	var b strings.Builder
	data := struct {
		*Stack
		Level, Snapshotter, Overlayfs string
		CRIEnabled, NRIEnabled        bool
	}{s, level, Snapshotter, Overlayfs, s.cri != nil, s.cri != nil && s.cri.NRISocket != ""}
	if err := template.Must(template.New("config").Parse(containerdConfigTemplate)).Execute(&b, data); err != nil {
		return "", fmt.Errorf("render containerd config: %w", err)
	}
	if s.cri != nil {
		cri, err := s.criConfig()
		if err != nil {
			return "", err
		}
		b.WriteString(cri)
	}
	b.WriteString("\n" + extra)
	path := filepath.Join(s.Dir, "containerd.toml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return "", fmt.Errorf("write containerd config: %w", err)
	}
	return path, nil
}

// Client returns a containerd Go client in Namespace, closed by Close.
func (s *Stack) Client() (*client.Client, error) {
	if s.client == nil {
		cl, err := client.New(s.Address, client.WithDefaultNamespace(s.Namespace))
		if err != nil {
			return nil, fmt.Errorf("connect to containerd: %w", err)
		}
		s.client = cl
	}
	return s.client, nil
}
