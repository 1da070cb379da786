package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/pause"
	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
)

func writeConfig(t *testing.T, allowAnnotation bool) (path, runDir string) {
	t.Helper()
	dir := t.TempDir()
	runDir = filepath.Join(dir, "run")
	path = filepath.Join(dir, "config.toml")
	body := fmt.Sprintf("[restore]\nallow_annotation = %v\n\n[shim]\nrun_dir = %q\n", allowAnnotation, runDir)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, runDir
}

func newLauncher(t *testing.T) (*Launcher, *fakeDriver) {
	d := &fakeDriver{t: t, sys: &nopSystem{}}
	return &Launcher{NewDriver: func(config.Config) (hypervisor.Driver, error) { return d, nil }}, d
}

func TestLaunchPlan(t *testing.T) {
	tests := []struct {
		name        string
		allow       bool
		annotation  string
		wantMode    string
		wantWarning string
		wantErr     string
	}{
		{"best mode by default", false, "", "mmap", "", ""},
		{"annotation chooses copy", true, "copy", "copy", "", ""},
		{"disallowed annotation is ignored", false, "copy", "mmap", "allow_annotation is false", ""},
		{"unknown mode fails", true, "fast", "", "", `"fast"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfgPath, runDir := writeConfig(t, tt.allow)
			l, d := newLauncher(t)
			spec := &specs.Spec{Annotations: map[string]string{}}
			if tt.annotation != "" {
				spec.Annotations["io.cocoon.restore-mode"] = tt.annotation
			}
			sb, err := l.Launch(context.Background(), task.LaunchRequest{
				ID: "t1", Namespace: "ns", StagedDir: stageChain(t), ConfigPath: cfgPath, Hostname: "web", Spec: spec,
				Sysctls: map[string]string{"kernel.shm_rmid_forced": "1"},
			})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("Launch error %v, want an invalid argument naming %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sb.Guest.Close(); _ = sb.VM.Close() })
			if string(sb.Plan.Mode) != tt.wantMode || string(d.restores[0].Mode) != tt.wantMode {
				t.Fatalf("plan mode %q, driver asked for %q; want %q", sb.Plan.Mode, d.restores[0].Mode, tt.wantMode)
			}
			if got := strings.Join(sb.Plan.Warnings, "; "); !strings.Contains(got, tt.wantWarning) || (tt.wantWarning == "" && got != "") {
				t.Fatalf("warnings %q, want %q", got, tt.wantWarning)
			}
			if want := filepath.Join(runDir, "ns", "t1"); sb.RunDir != want || d.restores[0].RunDir != want {
				t.Fatalf("run dir %s (driver %s), want %s", sb.RunDir, d.restores[0].RunDir, want)
			}
			if d.sys.name() != "web" {
				t.Fatalf("guest hostname %q, want web", d.sys.name())
			}
			if got := d.sys.sysctlsSet(); got["kernel.shm_rmid_forced"] != "1" || len(got) != 1 {
				t.Fatalf("guest sysctls %v, want the request's kernel.shm_rmid_forced = 1", got)
			}
			if len(sb.Phases) < 2 || sb.Phases[0].Name != PhasePlan || sb.Phases[0].Duration <= 0 || sb.Phases[1].Name != "spawn" {
				t.Fatalf("phases %+v, want the shim's plan, then the driver's spawn", sb.Phases)
			}
		})
	}
}

func TestLaunchRejectsUnstagedRootfs(t *testing.T) {
	cfgPath, _ := writeConfig(t, false)
	l, _ := newLauncher(t)
	_, err := l.Launch(context.Background(), task.LaunchRequest{ID: "t1", StagedDir: t.TempDir(), ConfigPath: cfgPath})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "--snapshotter cocoon") {
		t.Fatalf("Launch of a plain directory: %v, want an invalid argument pointing at the snapshotter", err)
	}
}

// TestLaunchMemoryLimit: a memory limit below the snapshot's guest memory
// fails before any VM exists; one that fits becomes the VM's budget.
func TestLaunchMemoryLimit(t *testing.T) {
	cfgPath, _ := writeConfig(t, false)
	staged := stageChain(t)
	for _, c := range []struct {
		name  string
		limit int64
		ok    bool
	}{
		{"below the guest", 32 << 10, false},
		{"above the guest", 1 << 40, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			l, d := newLauncher(t)
			spec := &specs.Spec{Linux: &specs.Linux{Resources: &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &c.limit}}}}
			sb, err := l.Launch(context.Background(), task.LaunchRequest{ID: "t1", Namespace: "ns", StagedDir: staged, ConfigPath: cfgPath, Spec: spec})
			if !c.ok {
				if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "guest memory") || len(d.restores) != 0 {
					t.Fatalf("Launch with limit %d: %v after %d restores, want an invalid argument naming the guest memory and no restore", c.limit, err, len(d.restores))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sb.Guest.Close(); _ = sb.VM.Close() })
			if sb.Memory.Guest <= 0 || sb.Memory.Headroom != 256<<20 {
				t.Fatalf("memory budget %+v, want the link's guest memory and the default headroom", sb.Memory)
			}
		})
	}
}

// TestLaunchInlineConfig: a CRI handler's options table arrives as the
// config body; a key it does not know fails the launch naming it.
func TestLaunchInlineConfig(t *testing.T) {
	l, d := newLauncher(t)
	_, err := l.Launch(context.Background(), task.LaunchRequest{ID: "t1", StagedDir: stageChain(t), ConfigBody: "NoSuchOption = true\n"})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "NoSuchOption") || len(d.restores) != 0 {
		t.Fatalf("Launch with an unknown inline option: %v after %d restores, want an invalid argument naming it and no restore", err, len(d.restores))
	}
}

func TestLaunchBadConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte("[restore]\nmood = \"happy\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, _ := newLauncher(t)
	_, err := l.Launch(context.Background(), task.LaunchRequest{ID: "t1", StagedDir: stageChain(t), ConfigPath: path})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "mood") {
		t.Fatalf("Launch with an unknown config key: %v, want an invalid argument naming it", err)
	}
}

// TestLaunchReportsSpawn: the Spawned hook sees the VM once, after the
// driver made it and before its guest is initialised.
func TestLaunchReportsSpawn(t *testing.T) {
	cfgPath, runDir := writeConfig(t, false)
	l, d := newLauncher(t)
	var got []task.Spawn
	var hostnameAtSpawn string
	sb, err := l.Launch(context.Background(), task.LaunchRequest{
		ID: "t1", Namespace: "ns", StagedDir: stageChain(t), ConfigPath: cfgPath, Hostname: "web",
		Spawned: func(sp task.Spawn) {
			got = append(got, sp)
			hostnameAtSpawn = d.sys.name()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Guest.Close(); _ = sb.VM.Close() })
	want := task.Spawn{PID: sb.VM.PID(), Hypervisor: "fake", RunDir: filepath.Join(runDir, "ns", "t1"), Plan: sb.Plan}
	if len(got) != 1 || got[0].PID != want.PID || got[0].Hypervisor != want.Hypervisor || got[0].RunDir != want.RunDir || got[0].Plan.Mode != want.Plan.Mode {
		t.Fatalf("Spawned calls %+v, want one with %+v", got, want)
	}
	if hostnameAtSpawn != "" {
		t.Fatalf("guest already initialised (hostname %q) when the spawn was reported", hostnameAtSpawn)
	}
}

// TestDriverPerConfig: a shim makes one driver per driver config and
// reuses it, the warmed one included.
func TestDriverPerConfig(t *testing.T) {
	cfgPath, _ := writeConfig(t, false)
	dir := t.TempDir()
	other := filepath.Join(dir, "other.toml")
	body := fmt.Sprintf("[qemu]\nbinary = \"/opt/qemu/bin/qemu-system-x86_64\"\n\n[shim]\nrun_dir = %q\n", filepath.Join(dir, "run"))
	if err := os.WriteFile(other, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(config.EnvPath, cfgPath)
	d := &fakeDriver{t: t, sys: &nopSystem{}}
	made := 0
	l := &Launcher{NewDriver: func(config.Config) (hypervisor.Driver, error) { made++; return d, nil }}
	l.Warm(context.Background())
	steps := []struct {
		configPath string
		wantMade   int
	}{
		{"", 1},      // the warmed driver
		{cfgPath, 1}, // the same config, named
		{other, 2},   // another QEMU binary
		{other, 2},   // reused
	}
	for i, s := range steps {
		sb, err := l.Launch(context.Background(), task.LaunchRequest{
			ID: fmt.Sprintf("t%d", i), Namespace: "ns", StagedDir: stageChain(t), ConfigPath: s.configPath,
		})
		if err != nil {
			t.Fatal(err)
		}
		_ = sb.Guest.Close()
		_ = sb.VM.Close()
		if made != s.wantMade {
			t.Fatalf("launch %d (config %q): %d drivers made, want %d", i, s.configPath, made, s.wantMade)
		}
	}
}

// TestLaunchPreparesTheProcess: the task's init process is prepared in the
// guest as the VM comes up, and the guest's Exec of it starts that one
// (an Exec of the same id would find it taken).
func TestLaunchPreparesTheProcess(t *testing.T) {
	testenv.RequireRoot(t) // the agent sets the process's credentials
	cfgPath, _ := writeConfig(t, false)
	l, _ := newLauncher(t)
	init := task.ProcessSpec{ID: task.InitGuestID, Args: []string{"true"}, Cwd: "/"}
	sb, err := l.Launch(context.Background(), task.LaunchRequest{
		ID: "t1", Namespace: "ns", StagedDir: stageChain(t), ConfigPath: cfgPath, Process: &init,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Guest.Close(); _ = sb.VM.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := sb.Guest.Exec(ctx, init); err != nil {
		t.Fatalf("start the prepared process: %v", err)
	}
	if exit, err := sb.Guest.Wait(ctx, init.ID); err != nil || exit.Status != 0 {
		t.Errorf("the prepared process exited %+v, %v; want 0", exit, err)
	}
}

// TestPrepareWarmsPodVMs: a pod's VM asks its guest to warm runc, or with
// shim.own_init its own container init, for the containers to come when
// shim.warm_runc says so; a container's own VM, which runs no runc,
// never does.
func TestPrepareWarmsPodVMs(t *testing.T) {
	pod := &specs.Spec{Annotations: map[string]string{"io.kubernetes.cri.container-type": "sandbox"}}
	for _, tc := range []struct {
		name      string
		spec      *specs.Spec
		warm, own bool
		want      bool
	}{
		{"pod VM", pod, true, false, true},
		{"pod VM, own init", pod, true, true, true},
		{"pod VM, warm_runc off", pod, false, false, false},
		{"a container's own VM", &specs.Spec{}, true, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Shim.RunDir, cfg.Shim.WarmRunc, cfg.Shim.OwnInit = t.TempDir(), tc.warm, tc.own
			d := &fakeDriver{t: t, sys: &nopSystem{}}
			r := task.LaunchRequest{ID: "t1", Namespace: "ns", Spec: tc.spec}
			p, err := prepare(context.Background(), cfg, d, r, source{dir: stageChain(t)})
			if err != nil {
				t.Fatal(err)
			}
			if p.guest.WarmContainers != tc.want || p.guest.WarmOwnInit != tc.own {
				t.Fatalf("guest setup warms: %v (own init %v), want %v (%v)", p.guest.WarmContainers, p.guest.WarmOwnInit, tc.want, tc.own)
			}
		})
	}
}

// TestPodPause: the process of a pod sandbox the CRI made is the guest's
// own pause, with the rest of what the pause's spec asks; any other
// process is as asked.
func TestPodPause(t *testing.T) {
	sandbox := &specs.Spec{Annotations: map[string]string{"io.kubernetes.cri.container-type": "sandbox", "io.kubernetes.cri.sandbox-name": "web"}}
	typeOnly := &specs.Spec{Annotations: map[string]string{"io.kubernetes.cri.container-type": "sandbox"}}
	asked := &agent.ExecRequest{ID: "init", Args: []string{"/pause"}, Cwd: "/pause-dir", UID: 65535, OwnPIDNamespace: true}
	for _, tc := range []struct {
		name string
		r    task.LaunchRequest
		want *agent.ExecRequest
	}{
		{"pod sandbox", task.LaunchRequest{Spec: sandbox, Process: asked},
			&agent.ExecRequest{ID: "init", Args: []string{pause.Path}, Cwd: "/", UID: 65535, OwnPIDNamespace: true}},
		{"a container", task.LaunchRequest{Spec: &specs.Spec{}, Process: asked}, asked},
		{"a sandbox not the CRI's", task.LaunchRequest{Spec: typeOnly, Process: asked}, asked},
		{"no process", task.LaunchRequest{Spec: sandbox}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := podPause(tc.r); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("process %+v, want %+v", got, tc.want)
			}
		})
	}
}
