package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/network"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
)

// TestLaunchNamesWhatItCreatesFirst: Starting hears every name the launch
// may create (run dir, tap in the spec's namespace, an ordinary image's
// base snapshot) before anything exists, the VM included; an error there
// stops the launch.
func TestLaunchNamesWhatItCreatesFirst(t *testing.T) {
	dir := t.TempDir()
	runDir := filepath.Join(dir, "run")
	cfgPath := filepath.Join(dir, "config.toml")
	body := fmt.Sprintf("[restore]\nbase_image = \"example.com/base:1\"\n\n[shim]\nrun_dir = %q\n", runDir)
	if err := os.WriteFile(cfgPath, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	// No namespace is there: the launch fails opening it, after Starting.
	netns := filepath.Join(dir, "netns")
	spec := &specs.Spec{Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.NetworkNamespace, Path: netns}}}}
	refused := errors.New("disk full")
	tests := []struct {
		name   string
		rootfs *chain.StagedRootfs
		refuse error
		want   task.Spawn
	}{
		{"snapshot image in a namespace", nil, nil, task.Spawn{
			Hypervisor: "fake", RunDir: filepath.Join(runDir, "ns", "t1"),
			Network: &state.Network{NetNS: netns, Tap: network.TapName("t1")},
		}},
		{"ordinary image, record refused", &chain.StagedRootfs{}, refused, task.Spawn{
			Hypervisor: "fake", RunDir: filepath.Join(runDir, "ns", "t1"),
			Network: &state.Network{NetNS: netns, Tap: network.TapName("t1")},
			Base:    &state.Base{Namespace: "ns", Snapshotter: "cocoon", Key: "cocoon-base-t1"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, d := newLauncher(t)
			var got []task.Spawn
			_, err := l.Launch(context.Background(), task.LaunchRequest{
				ID: "t1", Namespace: "ns", Spec: spec, StagedDir: stageChain(t), Rootfs: tt.rootfs, ConfigPath: cfgPath,
				Starting: func(sp task.Spawn) error {
					if _, err := os.Stat(sp.RunDir); !errors.Is(err, os.ErrNotExist) {
						t.Errorf("run dir exists (stat: %v) when Starting is called", err)
					}
					got = append(got, sp)
					return tt.refuse
				},
			})
			if err == nil || (tt.refuse != nil && !errors.Is(err, tt.refuse)) {
				t.Fatalf("Launch = %v, want an error (%v)", err, tt.refuse)
			}
			if len(got) != 1 || !reflect.DeepEqual(got[0], tt.want) {
				t.Fatalf("Starting calls %+v, want one with %+v", got, tt.want)
			}
			if len(d.restores) != 0 {
				t.Fatalf("the driver restored %d VMs", len(d.restores))
			}
		})
	}
}
