package agent_test

import (
	"context"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/internal/vmtest"
)

// containerRoot is the busybox root the guest's containers share, in the
// guest's /tmp (a tmpfs).
const containerRoot = "/tmp/container-rootfs"

// containerTimeout bounds a container call: runc under TCG takes seconds.
const containerTimeout = 2 * time.Minute

// TestVMContainers boots the real guest and runs containers in it through
// the agent's container calls and the guest's runc: confined as their
// specs ask, an exec, stats and an update, one OOM-killed alone beside a
// running one, bad input refused, and nothing left once deleted.
func TestVMContainers(t *testing.T) {
	vm := vmtest.Boot(t)
	client := vm.Client(t)
	t.Cleanup(func() { _ = client.Close() })
	guestSh(t, client, "mkdir -p "+containerRoot+"/bin "+containerRoot+"/etc && cd "+containerRoot+
		" && cp /bin/busybox bin/ && for a in $(busybox --list); do ln -s busybox bin/$a; done && echo s3cret >etc/secret", "")
	t.Run("WarmOwnInit", func(t *testing.T) { testWarmOwnInit(t, vm, client) })
	// The own init goes first: runc enables every controller above the
	// containers' cgroups, which would hide one the own init left off.
	for _, c := range []guestEngine{{client, true}, {client, false}} {
		t.Run(c.String(), func(t *testing.T) {
			t.Run("Confined", func(t *testing.T) { testContainerConfined(t, c) })
			t.Run("Running", func(t *testing.T) { testContainerRunning(t, c) })
			t.Run("Stdio", func(t *testing.T) { testContainerStdio(t, c) })
			t.Run("Identity", func(t *testing.T) { testContainerIdentity(t, c) })
			t.Run("Refused", func(t *testing.T) { testContainerRefused(t, c) })
			left := guestSh(t, client, "runc --root /run/runc list -q; ls /run/cocoon/containers; find /sys/fs/cgroup/cocoon -mindepth 1 -type d; "+
				"grep -sl '^State:.Z' /proc/[0-9]*/status || true", "")
			if left != "" {
				t.Errorf("left in the guest after every container's delete (runc's containers, bundles, cgroups, zombies):\n%s", left)
			}
		})
	}
}

// testWarmOwnInit: a pod VM's Init warms the own container init: its
// throwaway container's cgroup is made (the first under the containers'
// parent) and everything of it removed, with no warning on the console.
func testWarmOwnInit(t *testing.T, vm *vmtest.VM, c *agent.Client) {
	if _, err := c.Init(containerCtx(t), agent.InitRequest{WarmContainers: true, WarmOwnInit: true}); err != nil {
		t.Fatalf("init: %v", err)
	}
	done := "test -d /sys/fs/cgroup/cocoon && ! test -e /sys/fs/cgroup/cocoon/.warm && ! test -e /run/cocoon/containers/.warm && echo done || true"
	deadline := time.Now().Add(containerTimeout)
	for guestSh(t, c, done, "") != "done\n" {
		if time.Now().After(deadline) {
			t.Fatalf("the warm-up neither ran nor ended within %v", containerTimeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if log, err := os.ReadFile(vm.Log); err != nil || strings.Contains(string(log), "warm the guest") {
		t.Errorf("the warm-up failed (console: %v):\n%s", err, log)
	}
}

// guestEngine is the agent's client with the guest's engine its
// containers are made with: runc, or the agent's own container init.
type guestEngine struct {
	*agent.Client
	own bool
}

func (g guestEngine) String() string {
	if g.own {
		return "OwnInit"
	}
	return "Runc"
}

// CreateContainer creates with g's engine.
func (g guestEngine) CreateContainer(ctx context.Context, id string, spec *specs.Spec, rootfs string, stdin bool) (*agent.ContainerProcess, error) {
	return g.CreateContainerFrom(ctx, id, spec, agent.ContainerRoot{Dir: rootfs, OwnInit: g.own}, stdin)
}

// guestSpec is containerd's default spec, as ctr run gives the shim.
func guestSpec(t *testing.T, id string, opts ...oci.SpecOpts) *specs.Spec {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), "cocoon-test")
	s, err := oci.GenerateSpec(ctx, nil, &containers.Container{ID: id}, append([]oci.SpecOpts{oci.WithDefaultPathEnv}, opts...)...)
	if err != nil {
		t.Fatalf("generate spec: %v", err)
	}
	return s
}

// containerCtx is a context for one container call.
func containerCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), containerTimeout)
	t.Cleanup(cancel)
	return ctx
}

// createStarted creates and starts a container.
func createStarted(t *testing.T, c guestEngine, id string, opts ...oci.SpecOpts) *agent.ContainerProcess {
	t.Helper()
	spec := guestSpec(t, id, opts...)
	began := time.Now()
	p, err := c.CreateContainer(containerCtx(t), id, spec, containerRoot, false)
	if err != nil {
		t.Fatalf("create %s: %v", id, err)
	}
	created := time.Now()
	if _, err := c.StartContainer(containerCtx(t), id); err != nil {
		t.Fatalf("start %s: %v", id, err)
	}
	t.Logf("%s: create %v, start %v (TCG)", id, created.Sub(began).Round(time.Millisecond), time.Since(created).Round(time.Millisecond))
	return p
}

// drainContainer reads p's output to its end and waits for it.
func drainContainer(t *testing.T, p *agent.ContainerProcess) (string, string, agent.ContainerExit) {
	t.Helper()
	_, out, errOut := p.Stdio()
	var stdout, stderr string
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); stdout = readAll(t, out) }()
	go func() { defer wg.Done(); stderr = readAll(t, errOut) }()
	wg.Wait()
	e, err := p.Wait(containerCtx(t))
	if err != nil {
		t.Fatalf("wait for %s: %v", p, err)
	}
	return stdout, stderr, e
}

// testContainerConfined: the "restricted" profile holds in the guest.
func testContainerConfined(t *testing.T, c guestEngine) {
	agentPid := strings.TrimSpace(guestSh(t, c.Client, "pidof cocoon-agent", ""))
	script := "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; echo pid=$$; touch /x 2>/dev/null || echo root-ro; " +
		"cat /etc/secret; kill -0 " + agentPid + " 2>/dev/null || echo agent-unreachable; set -- /proc/[0-9]*; echo procs=$#"
	p := createStarted(t, c, "confined", oci.WithProcessArgs("sh", "-c", script), oci.WithCapabilities(nil),
		oci.WithNoNewPrivileges, seccomp.WithDefaultProfile(), oci.WithRootFSReadonly(), oci.WithMaskedPaths([]string{"/etc/secret"}))
	stdout, stderr, e := drainContainer(t, p)
	t.Logf("the container printed:\n%s", stdout)
	if e.Code != 0 || e.OOMKilled {
		t.Errorf("exit %+v, stderr %q", e, stderr)
	}
	for _, want := range []string{"CapEff:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2", "pid=1", "root-ro", "agent-unreachable", "procs=1"} {
		// One process in /proc, the shell (its glob forks nothing);
		// nothing of the guest's.
		if !strings.Contains(stdout, want+"\n") {
			t.Errorf("stdout lacks %q", want)
		}
	}
	if strings.Contains(stdout, "s3cret") {
		t.Errorf("the masked /etc/secret was read")
	}
	if err := c.DeleteContainer(containerCtx(t), "confined", ""); err != nil {
		t.Fatalf("delete: %v", err)
	}
}

// testContainerRunning: exec, stats and update in a running container; a
// container over its memory limit OOM-killed alone beside it.
func testContainerRunning(t *testing.T, c guestEngine) {
	const limit = 32 << 20
	app := createStarted(t, c, "app", oci.WithProcessArgs("sleep", "1000"), oci.WithMemoryLimit(64<<20))
	hog := createStarted(t, c, "hog", oci.WithProcessArgs("dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1"),
		oci.WithMemoryLimit(limit), oci.WithMemorySwap(limit))
	_, stderr, e := drainContainer(t, hog)
	if e.Code != 137 || e.Signal != int(syscall.SIGKILL) || !e.OOMKilled {
		t.Errorf("hog's exit %+v (stderr %q), want 137 by SIGKILL, OOM-killed", e, stderr)
	}
	if err := c.DeleteContainer(containerCtx(t), "hog", ""); err != nil {
		t.Fatalf("delete hog: %v", err)
	}
	ex, err := c.ExecContainer(containerCtx(t), "app", "hello", &specs.Process{Args: []string{"echo", "alive"}, Env: []string{"PATH=/bin"}, Cwd: "/"}, false)
	if err != nil {
		t.Fatalf("exec in app after hog's OOM: %v", err)
	}
	if out, _, e := drainContainer(t, ex); out != "alive\n" || e.Code != 0 {
		t.Errorf("exec printed %q, exit %+v", out, e)
	}
	testContainerStats(t, c)
	if err := app.Signal(containerCtx(t), syscall.SIGKILL, false); err != nil {
		t.Fatalf("kill app: %v", err)
	}
	if e, err := app.Wait(containerCtx(t)); err != nil || e.Code != 137 || e.OOMKilled {
		t.Errorf("app's exit %+v, %v; want 137, not OOM-killed", e, err)
	}
	if err := c.DeleteContainer(containerCtx(t), "app", ""); err != nil {
		t.Fatalf("delete app: %v", err)
	}
}

// testContainerStats: app's stats show its own memory and limit, a
// container without limits its memory and pids too, and an update
// changes app's limit.
func testContainerStats(t *testing.T, c guestEngine) {
	m, err := c.ContainerStats(containerCtx(t), "app")
	if err != nil {
		t.Fatalf("stats: %v", err)
	}
	if m.Memory.Usage == 0 || m.Memory.UsageLimit != 64<<20 || m.CPU.UsageUsec == 0 || m.Pids.Current == 0 {
		t.Errorf("stats memory %+v, cpu %+v, pids %+v", m.Memory, m.CPU, m.Pids)
	}
	free := createStarted(t, c, "free", oci.WithProcessArgs("sleep", "1000"))
	if m, err := c.ContainerStats(containerCtx(t), "free"); err != nil || m.GetMemory().GetUsage() == 0 || m.GetPids().GetCurrent() == 0 {
		t.Errorf("stats of a container without limits: %+v, %v; want its memory and pids", m, err)
	}
	// The spec's device rules hold: root in the container may make a node
	// of /dev/mem, not open it.
	script := "mknod /tmp/mem c 1 1 && head -c1 /tmp/mem >/dev/null 2>&1 && echo opened || echo denied"
	ex, err := c.ExecContainer(containerCtx(t), "free", "mem", &specs.Process{Args: []string{"sh", "-c", script}, Env: []string{"PATH=/bin"}, Cwd: "/"}, false)
	if err != nil {
		t.Fatalf("exec in free: %v", err)
	}
	if out, _, e := drainContainer(t, ex); out != "denied\n" || e.Code != 0 {
		t.Errorf("opening /dev/mem's node: %q, exit %+v; want it denied", out, e)
	}
	if err := free.Signal(containerCtx(t), syscall.SIGKILL, false); err != nil {
		t.Fatalf("kill free: %v", err)
	}
	if _, err := free.Wait(containerCtx(t)); err != nil {
		t.Fatalf("wait for free: %v", err)
	}
	if err := c.DeleteContainer(containerCtx(t), "free", ""); err != nil {
		t.Fatalf("delete free: %v", err)
	}
	limit := int64(48 << 20)
	if err := c.UpdateContainer(containerCtx(t), "app", &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}}); err != nil {
		t.Fatalf("update: %v", err)
	}
	if m, err = c.ContainerStats(containerCtx(t), "app"); err != nil || m.Memory.UsageLimit != uint64(limit) {
		t.Errorf("limit after update: %+v, %v; want %d", m.GetMemory(), err, limit)
	}
}

// testContainerStdio: a container's stdin through the agent, and a
// terminal with its size set from the host.
func testContainerStdio(t *testing.T, c guestEngine) {
	for _, tc := range []struct {
		name, input, want string
		terminal          bool
		args              []string
	}{
		{name: "pipe", input: "hello\n", want: "hello\n", args: []string{"cat"}},
		{name: "terminal", input: "go\n", want: "40 100\r\ngot=go\r\n", terminal: true, args: []string{"sh", "-c", "read x; stty size; echo got=$x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := guestSpec(t, tc.name, oci.WithProcessArgs(tc.args...))
			spec.Process.Terminal = tc.terminal
			p, err := c.CreateContainer(containerCtx(t), tc.name, spec, containerRoot, true)
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			if _, err := c.StartContainer(containerCtx(t), tc.name); err != nil {
				t.Fatalf("start: %v", err)
			}
			if tc.terminal {
				if err := p.ResizePty(containerCtx(t), 100, 40); err != nil {
					t.Fatalf("resize: %v", err)
				}
			}
			in, out, errOut := p.Stdio()
			if _, err := io.WriteString(in, tc.input); err != nil {
				t.Fatalf("write stdin: %v", err)
			}
			if err := in.Close(); err != nil {
				t.Fatalf("close stdin: %v", err)
			}
			if got := readAll(t, out); !strings.HasSuffix(got, tc.want) {
				t.Errorf("output %q, want it to end with %q", got, tc.want)
			}
			if tc.terminal != (errOut == nil) {
				t.Errorf("stderr %v with terminal %v", errOut, tc.terminal)
			}
			if e, err := p.Wait(containerCtx(t)); err != nil || e.Code != 0 {
				t.Errorf("exit %+v, %v", e, err)
			}
			if err := c.DeleteContainer(containerCtx(t), tc.name, ""); err != nil {
				t.Fatalf("delete: %v", err)
			}
		})
	}
}

// testContainerIdentity: the process's user, groups, rlimits, cwd (made
// when the image lacks it), hostname and sysctls are the spec's, and an
// exec in a container whose PID namespace it shares sees its processes.
func testContainerIdentity(t *testing.T, c guestEngine) {
	script := "id -u; id -G; ulimit -n; pwd; hostname; cat /proc/sys/kernel/msgmax; grep CapEff /proc/self/status"
	p := createStarted(t, c, "who", oci.WithProcessArgs("sh", "-c", script), oci.WithUIDGID(1000, 1000),
		oci.WithProcessCwd("/home/made"), oci.WithHostname("podhost"),
		oci.WithRlimit(&specs.POSIXRlimit{Type: "RLIMIT_NOFILE", Soft: 123, Hard: 456}), oci.WithAddedCapabilities([]string{"CAP_NET_BIND_SERVICE"}),
		func(_ context.Context, _ oci.Client, _ *containers.Container, s *specs.Spec) error {
			s.Linux.Sysctl = map[string]string{"kernel.msgmax": "4242"}
			s.Process.User.AdditionalGids = []uint32{1000, 2000}
			return nil
		})
	stdout, stderr, e := drainContainer(t, p)
	// A non-root user keeps no effective capability, ambient ones aside.
	want := "1000\n1000 2000\n123\n/home/made\npodhost\n4242\nCapEff:\t0000000000000000\n"
	if stdout != want || e.Code != 0 {
		t.Errorf("printed %q (stderr %q, exit %+v), want %q", stdout, stderr, e, want)
	}
	if err := c.DeleteContainer(containerCtx(t), "who", ""); err != nil {
		t.Fatalf("delete: %v", err)
	}
	_, err := c.CreateContainer(containerCtx(t), "nope", guestSpec(t, "nope", oci.WithProcessArgs("no-such-program")), containerRoot, false)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "no-such-program") {
		t.Errorf("create of a missing program: %v, want a failed precondition naming it", err)
	}
}

// testContainerRefused: bad input is refused naming what was wrong.
func testContainerRefused(t *testing.T, c guestEngine) {
	netns := guestSpec(t, "netns", oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: "/proc/1/ns/net"}))
	for _, tc := range []struct {
		name   string
		call   func() error
		class  func(error) bool
		errHas string
	}{
		{"netns-path", func() error {
			_, err := c.CreateContainer(containerCtx(t), "netns", netns, containerRoot, false)
			return err
		}, errdefs.IsInvalidArgument, "/proc/1/ns/net"},
		{"no-rootfs", func() error {
			_, err := c.CreateContainer(containerCtx(t), "nort", guestSpec(t, "nort"), "/tmp/none", false)
			return err
		}, errdefs.IsFailedPrecondition, "/tmp/none"},
		{"bad-id", func() error {
			_, err := c.CreateContainer(containerCtx(t), "a/b", guestSpec(t, "x"), containerRoot, false)
			return err
		}, errdefs.IsInvalidArgument, "a/b"},
		{"start-unknown", func() error {
			_, err := c.StartContainer(containerCtx(t), "nothing")
			return err
		}, errdefs.IsNotFound, "nothing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if !tc.class(err) || !strings.Contains(err.Error(), tc.errHas) {
				t.Errorf("error %v, want one of the right class naming %q", err, tc.errHas)
			}
		})
	}
}
