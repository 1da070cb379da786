package manager

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	bootapi "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	"github.com/containerd/containerd/api/types"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/protobuf/proto"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/opencontainers/runtime-spec/specs-go/features"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/shimtest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
)

// fakeServerEnv makes the test binary act as the task server Start spawns:
// it writes its pid into the bundle and accepts on the inherited socket.
const fakeServerEnv = "COCOON_MANAGER_TEST_SERVER"

func TestMain(m *testing.M) {
	if os.Getenv(fakeServerEnv) != "" {
		shimtest.Serve()
		return
	}
	os.Exit(m.Run())
}

// TestStart starts a task server through package launch and answers in
// containerd's bootstrap format.
func TestStart(t *testing.T) {
	t.Setenv(fakeServerEnv, "1")
	socketDir, err := os.MkdirTemp("/tmp", "cocoon-mgr-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(socketDir) })
	bundle := t.TempDir()
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte(`{"ociVersion":"1.2.0"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(bundle)
	ctx := namespaces.WithNamespace(context.Background(), "test")
	res, err := New(Name).Start(ctx, &bootapi.BootstrapParams{InstanceID: "t1", ContainerdGrpcAddress: "/run/test.sock", SocketDir: &socketDir})
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	testenv.Eventually(t, 10*time.Second, "the server's pid", func() error {
		data, err := os.ReadFile(filepath.Join(bundle, shimtest.PIDFile))
		if err == nil {
			pid, err = strconv.Atoi(string(data))
		}
		return err
	})
	shimtest.KillAtCleanup(t, pid)
	if res.Version != 3 || res.Protocol != "ttrpc" || !strings.HasPrefix(res.Address, "unix://"+socketDir+"/") {
		t.Fatalf("Start = %+v, want version 3 ttrpc in %s", res, socketDir)
	}
}

func TestStopKillsRecordedVM(t *testing.T) {
	vm := exec.Command("sleep", "60")
	if err := vm.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = vm.Wait(); close(exited) }()
	t.Cleanup(func() { _ = vm.Process.Kill(); <-exited })
	start, err := state.StartTime(vm.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}

	bundle := t.TempDir()
	runDir := filepath.Join(t.TempDir(), "run")
	if err := os.Mkdir(runDir, 0o700); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 29, 16, 0, 0, 0, time.UTC)
	tests := []struct {
		name       string
		exit       *state.Exit
		wantStatus int
	}{
		{"crashed while running", nil, 128 + int(unix.SIGKILL)},
		{"init had exited", &state.Exit{Status: 7, At: at}, 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &state.Task{ID: "t1", PID: vm.Process.Pid, PIDStart: start, RunDir: runDir, Exit: tt.exit}
			if err := state.WriteTask(bundle, rec); err != nil {
				t.Fatal(err)
			}
			ctx := context.WithValue(context.Background(), shim.OptsKey{}, shim.Opts{BundlePath: bundle})
			ss, err := New(Name).Stop(ctx, "t1")
			if err != nil {
				t.Fatal(err)
			}
			if ss.Pid != vm.Process.Pid || ss.ExitStatus != tt.wantStatus {
				t.Fatalf("Stop = pid %d status %d, want pid %d status %d", ss.Pid, ss.ExitStatus, vm.Process.Pid, tt.wantStatus)
			}
		})
	}
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("Stop left the recorded VM running")
	}
	if _, err := os.Stat(runDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Stop left the run dir (stat: %v)", err)
	}
}

func TestStopWithoutRecord(t *testing.T) {
	ctx := context.WithValue(context.Background(), shim.OptsKey{}, shim.Opts{BundlePath: t.TempDir()})
	ss, err := New(Name).Stop(ctx, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if ss.ExitStatus != 128+int(unix.SIGKILL) || ss.Pid != 0 {
		t.Fatalf("Stop without a record = %+v, want pid 0 and SIGKILL status", ss)
	}
}

func TestInfo(t *testing.T) {
	opts := &runtimeoptions.Options{ConfigPath: "/etc/cocoon/fast.toml"}
	anyOpts, err := typeurl.MarshalAnyToProto(opts)
	if err != nil {
		t.Fatal(err)
	}
	data, err := proto.Marshal(anyOpts)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		input    []byte
		wantPath string
	}{
		{"no options", nil, ""},
		{"config path", data, "/etc/cocoon/fast.toml"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			info, err := New(Name).Info(context.Background(), bytes.NewReader(tt.input))
			if err != nil {
				t.Fatal(err)
			}
			if info.Name != Name {
				t.Fatalf("name %q, want %q", info.Name, Name)
			}
			if got := infoConfigPath(t, info); got != tt.wantPath {
				t.Fatalf("echoed config path %q, want %q", got, tt.wantPath)
			}
			// containerd's CRI takes recursive read-only mounts for a
			// runtime whose features list rro.
			feat, err := typeurl.UnmarshalAny(info.Features)
			if err != nil {
				t.Fatalf("features: %v", err)
			}
			if f, ok := feat.(*features.Features); !ok || !slices.Contains(f.MountOptions, "rro") || slices.Contains(f.Hooks, "startContainer") {
				t.Fatalf("features %+v: want rro among the mount options and no startContainer hook", feat)
			}
		})
	}
}

func infoConfigPath(t *testing.T, info *types.RuntimeInfo) string {
	t.Helper()
	if info.Options == nil {
		return ""
	}
	v, err := typeurl.UnmarshalAny(info.Options)
	if err != nil {
		t.Fatal(err)
	}
	return v.(*runtimeoptions.Options).ConfigPath
}

func TestStopRemovesCgroup(t *testing.T) {
	testenv.RequireRoot(t)
	path := fmt.Sprintf("/cocoon-mgr-test-%d", os.Getpid())
	var dir string
	if cgroups.Mode() == cgroups.Unified {
		if _, err := cgroup2.NewManager("/sys/fs/cgroup", path, &cgroup2.Resources{}); err != nil {
			t.Fatal(err)
		}
		dir = filepath.Join("/sys/fs/cgroup", path)
	} else {
		if _, err := cgroup1.New(cgroup1.StaticPath(path), &specs.LinuxResources{}); err != nil {
			t.Fatal(err)
		}
		dir = filepath.Join("/sys/fs/cgroup/pids", path)
	}
	t.Cleanup(func() { _ = deleteCgroup(path) })
	// A process the record does not name (a hypervisor whose pid a crash
	// kept from the record) is killed with the cgroup.
	left := exec.Command("sleep", "60")
	if err := left.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { left.Process.Kill(); left.Wait() })
	procs := filepath.Join(dir, "cgroup.procs")
	if err := os.WriteFile(procs, []byte(strconv.Itoa(left.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	bundle := t.TempDir()
	if err := state.WriteTask(bundle, &state.Task{ID: "t1", Cgroup: path}); err != nil {
		t.Fatal(err)
	}
	ctx := context.WithValue(context.Background(), shim.OptsKey{}, shim.Opts{BundlePath: bundle})
	if _, err := New(Name).Stop(ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Stop left cgroup %s (stat: %v)", dir, err)
	}
}

func TestStopRemovesStaleSocket(t *testing.T) {
	tests := []struct {
		name     string
		live     bool
		wantKept bool
	}{
		{"crashed server", false, false},
		{"live server of the group", true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, err := os.MkdirTemp("/tmp", "cocoon-sock-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			sock := filepath.Join(dir, "s")
			l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			l.SetUnlinkOnClose(false)
			if tt.live {
				go func() {
					for {
						c, err := l.Accept()
						if err != nil {
							return
						}
						c.Close()
					}
				}()
			}
			t.Cleanup(func() { l.Close() })
			if !tt.live {
				l.Close()
			}
			bundle := t.TempDir()
			boot := `{"version":3,"address":"unix://` + sock + `","protocol":"ttrpc"}`
			if err := os.WriteFile(filepath.Join(bundle, "bootstrap.json"), []byte(boot), 0o600); err != nil {
				t.Fatal(err)
			}
			ctx := context.WithValue(context.Background(), shim.OptsKey{}, shim.Opts{BundlePath: bundle})
			if _, err := New(Name).Stop(ctx, "t1"); err != nil {
				t.Fatal(err)
			}
			_, err = os.Stat(sock)
			if kept := err == nil; kept != tt.wantKept {
				t.Fatalf("socket kept = %v, want %v", kept, tt.wantKept)
			}
		})
	}
}
