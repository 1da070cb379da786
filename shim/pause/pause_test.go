package pause

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/cnitest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/pause/hold"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
)

// TestMain lets Launch re-execute this test binary as the pause process.
func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == hold.Argv0 {
		hold.Main()
		return
	}
	os.Exit(m.Run())
}

func sandboxSpec(netns string) *specs.Spec {
	spec := &specs.Spec{
		Annotations: map[string]string{"io.kubernetes.cri.container-type": "sandbox"},
		Linux:       &specs.Linux{},
	}
	if netns != "" {
		spec.Linux.Namespaces = []specs.LinuxNamespace{{Type: specs.NetworkNamespace, Path: netns}}
	}
	return spec
}

func launch(t *testing.T, spec *specs.Spec) (*task.Sandbox, []task.Spawn) {
	t.Helper()
	var spawns []task.Spawn
	sb, err := Launcher{}.Launch(context.Background(), task.LaunchRequest{ID: "pod", Bundle: t.TempDir(), Spec: spec, Spawned: func(s task.Spawn) { spawns = append(spawns, s) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.VM.Close() })
	return sb, spawns
}

func nsInode(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestSandboxJoinsPodNetwork: the pause process runs in the pod's network
// namespace and is reported as the spawned "VM".
func TestSandboxJoinsPodNetwork(t *testing.T) {
	testenv.RequireRoot(t)
	netns := cnitest.NewNamespace(t)
	sb, spawns := launch(t, sandboxSpec(netns.Path))
	pid := sb.VM.PID()
	if len(spawns) != 1 || spawns[0].PID != pid {
		t.Fatalf("spawns %+v, want one for pid %d", spawns, pid)
	}
	if got, want := nsInode(t, fmt.Sprintf("/proc/%d/ns/net", pid)), nsInode(t, netns.Path); got != want {
		t.Fatalf("pause process in netns inode %d, want the pod's %d", got, want)
	}
	if self := nsInode(t, "/proc/self/ns/net"); self == nsInode(t, netns.Path) {
		t.Fatal("the shim itself moved into the pod's namespace")
	}
}

// TestSandboxSignals: SIGTERM ends the pause process with status 0, SIGKILL
// with 137, and a signal after the exit is NotFound; execs are refused.
func TestSandboxSignals(t *testing.T) {
	for _, c := range []struct {
		sig  unix.Signal
		want uint32
	}{{unix.SIGTERM, 0}, {unix.SIGINT, 0}, {unix.SIGKILL, 137}} {
		t.Run(c.sig.String(), func(t *testing.T) {
			sb, _ := launch(t, sandboxSpec(""))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := sb.Guest.Exec(ctx, task.ProcessSpec{ID: task.InitGuestID}); err != nil {
				t.Fatal(err)
			}
			if err := sb.Guest.Signal(ctx, task.InitGuestID, c.sig); err != nil {
				t.Fatal(err)
			}
			exit, err := sb.Guest.Wait(ctx, task.InitGuestID)
			if err != nil || exit.Status != c.want {
				t.Fatalf("exit %+v, %v; want status %d", exit, err, c.want)
			}
			if err := sb.Guest.Signal(ctx, task.InitGuestID, unix.SIGTERM); !errdefs.IsNotFound(err) {
				t.Fatalf("signal after exit: %v, want NotFound", err)
			}
			if _, err := sb.Guest.Exec(ctx, task.ProcessSpec{ID: "exec-1", Args: []string{"sh"}}); !errors.Is(err, errdefs.ErrNotImplemented) {
				t.Fatalf("exec in a sandbox: %v, want NotImplemented", err)
			}
		})
	}
}

// TestSandboxRecordedBeforeSpawn: Starting hears the pause process's run
// dir before the process exists, the process's command line names it (so
// `shim delete` finds a pause process whose shim died before recording its
// pid), and Close removes it.
func TestSandboxRecordedBeforeSpawn(t *testing.T) {
	bundle := t.TempDir()
	var starting []task.Spawn
	r := task.LaunchRequest{ID: "pod", Bundle: bundle, Spec: sandboxSpec(""), Starting: func(sp task.Spawn) error {
		starting = append(starting, sp)
		if _, err := os.Stat(sp.RunDir); err != nil {
			return fmt.Errorf("run dir not made before Starting: %w", err)
		}
		return nil
	}}
	sb, err := Launcher{}.Launch(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	if len(starting) != 1 || starting[0].PID != 0 || starting[0].RunDir != filepath.Join(bundle, runDirName) {
		t.Fatalf("Starting heard %+v, want one spawn without a pid naming %s", starting, filepath.Join(bundle, runDirName))
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", sb.VM.PID()))
	if err != nil || !strings.Contains(string(cmdline), starting[0].RunDir) {
		t.Fatalf("pause process cmdline %q (%v) does not name %s", cmdline, err, starting[0].RunDir)
	}
	if err := sb.VM.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(starting[0].RunDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Close left the run dir (stat: %v)", err)
	}
}
