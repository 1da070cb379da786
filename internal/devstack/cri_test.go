package devstack

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
)

// TestContainerdConfigCRI renders a CRI stack's containerd config and reads
// it back as containerd would: the CRI plugins are enabled, both
// snapshotters unpack imports, the sandbox image is pinned and every
// handler has its runtime type, snapshotter, annotations and options.
func TestContainerdConfigCRI(t *testing.T) {
	s, data := renderCRIConfig(t, CRI{
		Handlers: []Handler{{Name: "odd-name", RuntimeType: Runtime, Options: map[string]any{"Flag": true, "Quote": `a"b`}}},
	})
	var cfg struct {
		Disabled []string       `toml:"disabled_plugins"`
		Plugins  map[string]any `toml:"plugins"`
	}
	if err := toml.Unmarshal(data, &cfg); err != nil {
		t.Fatalf("config does not parse: %v\n%s", err, data)
	}
	if strings.Join(cfg.Disabled, ",") != "io.containerd.nri.v1.nri" {
		t.Errorf("disabled plugins %v, want only NRI", cfg.Disabled)
	}
	get := func(keys ...string) any {
		var v any = cfg.Plugins
		for _, k := range keys {
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		}
		return v
	}
	runtimes := []string{"io.containerd.cri.v1.runtime", "containerd", "runtimes"}
	for _, tc := range []struct {
		keys []string
		want any
	}{
		{[]string{"io.containerd.cri.v1.images", "pinned_images", "sandbox"}, "localhost/p/pause:1"},
		{[]string{"io.containerd.cri.v1.runtime", "cni", "conf_dir"}, "/cni/net.d"},
		{[]string{"io.containerd.cri.v1.runtime", "containerd", "default_runtime_name"}, RuncHandler},
		{append(runtimes, RuncHandler, "runtime_type"), "io.containerd.runc.v2"},
		{append(runtimes, RuncHandler, "options", "Root"), filepath.Join(s.Dir, "runc")},
		{append(runtimes, CocoonHandler, "snapshotter"), Snapshotter},
		{append(runtimes, CocoonHandler, "options", "ConfigPath"), s.ConfigPath},
		{append(runtimes, "odd-name", "options", "Flag"), true},
		{append(runtimes, "odd-name", "options", "Quote"), `a"b`},
	} {
		if got := get(tc.keys...); got != tc.want {
			t.Errorf("%s = %v, want %v", strings.Join(tc.keys, "."), got, tc.want)
		}
	}
	ann, _ := get(append(runtimes, CocoonHandler, "pod_annotations")...).([]any)
	if len(ann) != 1 || ann[0] != "io.cocoon.*" {
		t.Errorf("cocoon pod_annotations %v, want [io.cocoon.*]", ann)
	}
	unpack, _ := get("io.containerd.transfer.v1.local", "unpack_config").([]any)
	if len(unpack) != 2 {
		t.Errorf("unpack_config %v, want the cocoon and overlayfs snapshotters", unpack)
	}
}

func TestStartRejectsIncompleteCRI(t *testing.T) {
	netns := filepath.Join(t.TempDir(), "netns")
	for _, tc := range []struct {
		name string
		cri  CRI
		want string
	}{
		{"empty", CRI{}, "NetNS, CNIBinDir, CNIConfDir, SandboxArchive, SandboxImage empty"},
		{"no image", CRI{NetNS: netns, CNIBinDir: "b", CNIConfDir: "c", SandboxArchive: "a"}, "SandboxImage empty"},
		{"missing netns", CRI{NetNS: netns, CNIBinDir: "b", CNIConfDir: "c", SandboxArchive: "a", SandboxImage: "i"}, "network namespace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Start(t.Context(), Options{BinDir: t.TempDir(), CRI: &tc.cri})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Start = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestContainerdConfigCRIOptional renders the CRI plugin's optional parts:
// a registry config dir and NRI on a socket of the stack's, and checks
// that without them NRI stays disabled and no registry dir is set.
func TestContainerdConfigCRIOptional(t *testing.T) {
	for _, tc := range []struct {
		name           string
		registry, nri  string
		wantDisabled   string
		wantConfigPath any
		wantNRISocket  any
	}{
		{name: "none", wantDisabled: "io.containerd.nri.v1.nri"},
		{name: "both", registry: "/hosts", nri: "/n/nri.sock", wantConfigPath: "/hosts", wantNRISocket: "/n/nri.sock"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, data := renderCRIConfig(t, CRI{RegistryConfigPath: tc.registry, NRISocket: tc.nri})
			var cfg struct {
				Disabled []string `toml:"disabled_plugins"`
				Plugins  struct {
					Images struct {
						Registry struct {
							ConfigPath any `toml:"config_path"`
						} `toml:"registry"`
					} `toml:"io.containerd.cri.v1.images"`
					NRI struct {
						Disable    bool `toml:"disable"`
						SocketPath any  `toml:"socket_path"`
					} `toml:"io.containerd.nri.v1.nri"`
				} `toml:"plugins"`
			}
			if err := toml.Unmarshal(data, &cfg); err != nil {
				t.Fatalf("config does not parse: %v\n%s", err, data)
			}
			if got := strings.Join(cfg.Disabled, ","); got != tc.wantDisabled {
				t.Errorf("disabled plugins %q, want %q", got, tc.wantDisabled)
			}
			if got := cfg.Plugins.Images.Registry.ConfigPath; got != tc.wantConfigPath {
				t.Errorf("registry config_path %v, want %v", got, tc.wantConfigPath)
			}
			if got := cfg.Plugins.NRI.SocketPath; got != tc.wantNRISocket {
				t.Errorf("nri socket_path %v, want %v", got, tc.wantNRISocket)
			}
		})
	}
}

// TestContainerdConfigSandboxer: CocoonSandboxer = "shim" sets the cocoon
// handler's sandboxer and skips CRI's pause image pull for it; the runc
// handler keeps containerd's default sandboxer.
func TestContainerdConfigSandboxer(t *testing.T) {
	s, data := renderCRIConfig(t, CRI{CocoonSandboxer: SandboxerShim})
	type handler struct {
		Sandboxer     *string `toml:"sandboxer"`
		NoPausePull   *bool   `toml:"disable_pause_image_pull"`
		ConfigPathOpt struct {
			ConfigPath string `toml:"ConfigPath"`
		} `toml:"options"`
	}
	var cfg struct {
		Plugins struct {
			Runtime struct {
				Containerd struct {
					Runtimes map[string]handler `toml:"runtimes"`
				} `toml:"containerd"`
			} `toml:"io.containerd.cri.v1.runtime"`
		} `toml:"plugins"`
	}
	if err := toml.Unmarshal(data, &cfg); err != nil {
		t.Fatalf("config does not parse: %v\n%s", err, data)
	}
	cocoon := cfg.Plugins.Runtime.Containerd.Runtimes[CocoonHandler]
	if cocoon.Sandboxer == nil || *cocoon.Sandboxer != SandboxerShim || cocoon.NoPausePull == nil || !*cocoon.NoPausePull {
		t.Errorf("cocoon handler: sandboxer %v, disable_pause_image_pull %v; want %q and true\n%s", cocoon.Sandboxer, cocoon.NoPausePull, SandboxerShim, data)
	}
	if cocoon.ConfigPathOpt.ConfigPath != s.ConfigPath {
		t.Errorf("cocoon handler ConfigPath %q, want %q", cocoon.ConfigPathOpt.ConfigPath, s.ConfigPath)
	}
	if runc := cfg.Plugins.Runtime.Containerd.Runtimes[RuncHandler]; runc.Sandboxer != nil || runc.NoPausePull != nil {
		t.Errorf("runc handler: sandboxer %v, disable_pause_image_pull %v; want neither set", runc.Sandboxer, runc.NoPausePull)
	}
}

// renderCRIConfig writes the containerd config of a stack with cri (its
// paths and sandbox image filled in) and returns the stack and the config.
func renderCRIConfig(t *testing.T, cri CRI) (*Stack, []byte) {
	t.Helper()
	dir := t.TempDir()
	cri.NetNS, cri.CNIBinDir, cri.CNIConfDir = "/var/run/netns/x", "/cni/bin", "/cni/net.d"
	cri.SandboxArchive, cri.SandboxImage = "/a.tar", "localhost/p/pause:1"
	s := newStack(dir, Options{BinDir: dir, CRI: &cri})
	path, err := s.containerdConfig("", "info")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return s, data
}
