package devstack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"text/template"
	"time"

	"github.com/pelletier/go-toml/v2"
)

const (
	// CRINamespace is the containerd namespace of the CRI plugin's pods,
	// containers and images; a CRI stack's Ctr and Client use it.
	CRINamespace = "k8s.io"
	// Overlayfs is containerd's default snapshotter, the runc handler's.
	Overlayfs = "overlayfs"
	// RuncHandler and CocoonHandler are the CRI runtime handlers every CRI
	// stack has; RuncHandler is the default.
	RuncHandler   = "runc"
	CocoonHandler = "cocoon"
	// crictlTimeout bounds each CRI call crictl makes (its default, 2 s,
	// is shorter than a pod's network setup on a busy machine).
	crictlTimeout = 2 * time.Minute
)

// CRI runs containerd with its CRI plugin, inside a network namespace the
// caller made, so the CNI bridge and the pods' networks live there.
type CRI struct {
	// NetNS is the network namespace containerd runs in (nsenter --net),
	// e.g. /var/run/netns/NAME.
	NetNS string
	// CNIBinDir holds the CNI plugins (bridge, host-local, loopback);
	// CNIConfDir the network config list the CRI plugin uses.
	CNIBinDir, CNIConfDir string
	// SandboxArchive is an OCI archive holding SandboxImage, the pod
	// sandbox (pause) image. Start imports it into CRINamespace, unpacked
	// into each of SandboxSnapshotters, and pins it as the CRI plugin's
	// sandbox image: no registry is needed.
	SandboxArchive, SandboxImage string
	// SandboxSnapshotters are the snapshotters the sandbox image is
	// unpacked into at Start; Overlayfs and Snapshotter (the runc and
	// cocoon handlers') when nil.
	SandboxSnapshotters []string
	// Handlers are runtime handlers added to RuncHandler and CocoonHandler.
	Handlers []Handler
	// RegistryConfigPath, when set, is the CRI plugin's registry
	// config_path: a dir of HOST/hosts.toml files (mirrors for pulls).
	RegistryConfigPath string
	// NRISocket, when set, enables containerd's NRI plugin listening on
	// it (plugins connect there); NRI is disabled otherwise.
	NRISocket string
	// CocoonSandboxer is the cocoon handler's sandboxer (Handler.Sandboxer):
	// SandboxerShim for containerd's sandbox API.
	CocoonSandboxer string
}

// Handler is a CRI runtime handler: what a Kubernetes RuntimeClass names.
type Handler struct {
	Name           string
	RuntimeType    string
	Snapshotter    string
	PodAnnotations []string
	// Options are the runtime options containerd sends the shim. For a
	// runtime type other than runc's, containerd keeps only ConfigPath,
	// or, without one, sends the whole table as ConfigBody.
	Options map[string]any
	// Sandboxer is the handler's sandboxer: containerd's default
	// ("podsandbox", a pause container) when empty; SandboxerShim has
	// the shim serve containerd's sandbox API, with no pause image (the
	// handler then skips CRI's pull of it: disable_pause_image_pull).
	Sandboxer string
}

// SandboxerShim is the sandboxer that has a handler's shim serve
// containerd's sandbox API (runtime/sandbox/v1) for its pods.
const SandboxerShim = "shim"

func (c *CRI) validate() error {
	var missing []string
	for _, f := range []struct{ name, val string }{
		{"NetNS", c.NetNS}, {"CNIBinDir", c.CNIBinDir}, {"CNIConfDir", c.CNIConfDir},
		{"SandboxArchive", c.SandboxArchive}, {"SandboxImage", c.SandboxImage},
	} {
		if f.val == "" {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("cri options: %s empty: want the node's netns, its CNI dirs and the pause image", strings.Join(missing, ", "))
	}
	if _, err := os.Stat(c.NetNS); err != nil {
		return fmt.Errorf("cri options: network namespace: %w", err)
	}
	return nil
}

// handlers are the stack's runtime handlers: runc (Debian runc, its state
// under Dir), cocoon (this project's shim and snapshotter, the stack's
// cocoon config) and the caller's.
func (s *Stack) handlers() []Handler {
	return append([]Handler{{
		Name: RuncHandler, RuntimeType: "io.containerd.runc.v2",
		Options: map[string]any{"Root": filepath.Join(s.Dir, "runc")},
	}, {
		Name: CocoonHandler, RuntimeType: Runtime, Snapshotter: Snapshotter,
		PodAnnotations: []string{"io.cocoon.*"}, Options: map[string]any{"ConfigPath": s.ConfigPath},
		Sandboxer: s.cri.CocoonSandboxer,
	}}, s.cri.Handlers...)
}

const criConfigTemplate = `
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "{{.Overlayfs}}"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = {{quote .CRI.SandboxImage}}
{{- if .CRI.RegistryConfigPath}}
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = {{quote .CRI.RegistryConfigPath}}
{{- end}}
{{- if .CRI.NRISocket}}

[plugins."io.containerd.nri.v1.nri"]
  disable = false
  socket_path = {{quote .CRI.NRISocket}}
  # No pre-installed plugins: only those that connect to the socket.
  plugin_path = {{quote .NRIDir}}
  plugin_config_path = {{quote .NRIDir}}
{{- end}}

[plugins."io.containerd.cri.v1.runtime"]
  # Pod network namespaces are mounted under the state dir, not /var/run/netns.
  netns_mounts_under_state_dir = true
  # No CAP_SYS_RESOURCE on these machines: runc cannot give a pod a lower
  # oom_score_adj than containerd's own (CRI asks -998 for the sandbox).
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [{{quote .CRI.CNIBinDir}}]
    conf_dir = {{quote .CRI.CNIConfDir}}
    max_conf_num = 1
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "{{.Default}}"
{{- range .Handlers}}
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.{{quote .Name}}]
      runtime_type = {{quote .RuntimeType}}
{{- if .Snapshotter}}
      snapshotter = {{quote .Snapshotter}}
{{- end}}
{{- if .Sandboxer}}
      sandboxer = {{quote .Sandboxer}}
{{- end}}
{{- if eq .Sandboxer "shim"}}
      disable_pause_image_pull = true
{{- end}}
{{- if .PodAnnotations}}
      pod_annotations = [{{range $i, $a := .PodAnnotations}}{{if $i}}, {{end}}{{quote $a}}{{end}}]
{{- end}}
{{- if .Options}}
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.{{quote .Name}}.options]
{{options .Options}}
{{- end}}
{{- end}}
`

// criConfig renders the CRI plugin's part of containerd's config.
func (s *Stack) criConfig() (string, error) {
	funcs := template.FuncMap{"quote": tomlString, "options": tomlOptions}
	var b strings.Builder
	data := struct {
		CRI                        *CRI
		Handlers                   []Handler
		Overlayfs, Default, NRIDir string
	}{s.cri, s.handlers(), Overlayfs, RuncHandler, filepath.Join(s.Dir, "nri")}
	if err := template.Must(template.New("cri").Funcs(funcs).Parse(criConfigTemplate)).Execute(&b, data); err != nil {
		return "", fmt.Errorf("render cri config: %w", err)
	}
	return b.String(), nil
}

// tomlString quotes s as a TOML basic string.
func tomlString(s string) (string, error) {
	b, err := toml.Marshal(map[string]string{"k": s})
	if err != nil {
		return "", err
	}
	_, v, _ := strings.Cut(strings.TrimSpace(string(b)), " = ")
	return v, nil
}

// tomlOptions renders opts as key = value lines, keys sorted.
func tomlOptions(opts map[string]any) (string, error) {
	b, err := toml.Marshal(opts)
	if err != nil {
		return "", fmt.Errorf("encode runtime options: %w", err)
	}
	return strings.TrimRight(string(b), "\n"), nil
}

// startCRI imports the sandbox image into every sandbox snapshotter and
// writes crictl's config.
func (s *Stack) startCRI(ctx context.Context) error {
	sns := s.cri.SandboxSnapshotters
	if sns == nil {
		sns = []string{Overlayfs, Snapshotter}
	}
	if err := s.Import(ctx, s.cri.SandboxArchive, sns...); err != nil {
		return fmt.Errorf("import sandbox image %s: %w", s.cri.SandboxImage, err)
	}
	cfg := fmt.Sprintf("runtime-endpoint: unix://%s\nimage-endpoint: unix://%s\ntimeout: %d\n",
		s.Address, s.Address, int(crictlTimeout.Seconds()))
	if err := os.WriteFile(s.crictlConfig(), []byte(cfg), 0o644); err != nil {
		return fmt.Errorf("write crictl config: %w", err)
	}
	return nil
}

func (s *Stack) crictlConfig() string { return filepath.Join(s.Dir, "crictl.yaml") }

// Import imports the images of an OCI archive into Namespace, unpacked
// into each of snapshotters (each must be in the transfer service's
// unpack_config: Snapshotter or Overlayfs).
func (s *Stack) Import(ctx context.Context, archive string, snapshotters ...string) error {
	if len(snapshotters) == 0 {
		return errors.New("import: no snapshotter: want at least one to unpack into")
	}
	for _, sn := range snapshotters {
		if _, err := s.Ctr(ctx, "images", "import", "--snapshotter", sn, archive); err != nil {
			return fmt.Errorf("import %s into %s: %w", filepath.Base(archive), sn, err)
		}
	}
	return nil
}

// CrictlArgs is the crictl command line that talks to this stack's CRI
// plugin, from inside its network namespace (the CRI streaming server for
// exec -i/-t, attach and port-forward listens on its loopback), without
// the subcommand. It is nil for a stack without CRI.
func (s *Stack) CrictlArgs() []string {
	if s.cri == nil {
		return nil
	}
	endpoint := "unix://" + s.Address
	return []string{"nsenter", "--net=" + s.cri.NetNS, "--", filepath.Join(s.BinDir, "crictl"),
		"--config", s.crictlConfig(), "--runtime-endpoint", endpoint, "--image-endpoint", endpoint,
		"--timeout", crictlTimeout.String()}
}

// Crictl runs crictl against this stack's CRI plugin and returns its
// stdout; the error carries stderr.
func (s *Stack) Crictl(ctx context.Context, args ...string) (string, error) {
	base := s.CrictlArgs()
	if base == nil {
		return "", errors.New("crictl: the stack runs without CRI")
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, base[0], append(slices.Clone(base[1:]), args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("crictl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// removePods stops and removes every pod through the CRI plugin, so it
// tears their networks down (CNI DEL) and unmounts their namespaces.
func (s *Stack) removePods() error {
	ctx, cancel := context.WithTimeout(context.Background(), deleteTimeout)
	defer cancel()
	if _, err := s.Crictl(ctx, "rmp", "--all", "--force"); err != nil {
		return fmt.Errorf("teardown: remove pods: %w", err)
	}
	return nil
}
