package launch

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/shim"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/shimtest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/spare"
)

// fakeServerEnv makes the test binary act as the task server Start spawns.
const fakeServerEnv = "COCOON_LAUNCH_TEST_SERVER"

// TestMain makes the test binary the task server Start starts, spawned or
// as a spare: it records its pid and arguments in the bundle and accepts
// on the task socket.
func TestMain(m *testing.M) {
	if len(os.Args) == 3 && os.Args[1] == spare.Flag {
		if err := spare.Wait(os.Args[2], nil); err != nil {
			os.Exit(3)
		}
		shimtest.Serve()
		return
	}
	if os.Getenv(fakeServerEnv) != "" {
		shimtest.Serve()
		return
	}
	os.Exit(m.Run())
}

func writeSpec(t *testing.T, dir string, annotations map[string]string) {
	t.Helper()
	var b strings.Builder
	b.WriteString(`{"ociVersion":"1.2.0","annotations":{`)
	first := true
	for k, v := range annotations {
		if !first {
			b.WriteString(",")
		}
		first = false
		b.WriteString(strconv.Quote(k) + ":" + strconv.Quote(v))
	}
	b.WriteString("}}")
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

// env is a socket dir and a fake containerd for Start: a spare's watch
// connects to it, and closing it at cleanup ends the test's spares.
type env struct {
	socketDir, containerd string
	root                  string
}

func newEnv(t *testing.T) env {
	t.Helper()
	t.Setenv(fakeServerEnv, "1")
	dir, err := os.MkdirTemp("/tmp", "cocoon-launch-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	e := env{socketDir: filepath.Join(dir, "s"), containerd: filepath.Join(dir, "c.sock"), root: t.TempDir()}
	shimtest.NewContainerd(t, e.containerd+".ttrpc")
	return e
}

// start runs Start for task id in a bundle of its own with annotations.
func (e env) start(t *testing.T, id string, annotations map[string]string) (string, string) {
	t.Helper()
	bundle := filepath.Join(e.root, id)
	if err := os.Mkdir(bundle, 0o700); err != nil {
		t.Fatal(err)
	}
	writeSpec(t, bundle, annotations)
	t.Chdir(bundle)
	addr, err := Start(Request{ID: id, Namespace: "test", Containerd: e.containerd, SocketDir: e.socketDir, Server: os.Args[0]})
	if err != nil {
		t.Fatalf("Start(%s): %v", id, err)
	}
	return addr, bundle
}

// serverOf waits for the server Start started in bundle and returns its
// pid (killed at cleanup) and arguments.
func serverOf(t *testing.T, bundle string) (int, string) {
	t.Helper()
	var pid int
	testenv.Eventually(t, 10*time.Second, "the server's pid", func() error {
		data, err := os.ReadFile(filepath.Join(bundle, shimtest.PIDFile))
		if err != nil {
			return err
		}
		pid, err = strconv.Atoi(string(data))
		return err
	})
	shimtest.KillAtCleanup(t, pid)
	args, err := os.ReadFile(filepath.Join(bundle, shimtest.ArgsFile))
	if err != nil {
		t.Fatal(err)
	}
	return pid, string(args)
}

func TestGroupOf(t *testing.T) {
	tests := []struct {
		name        string
		annotations map[string]string
		want        string
	}{
		{"no annotations", nil, "t1"},
		{"pod sandbox", map[string]string{AnnotationSandboxID: "pod1"}, "pod1"},
		{"sandbox wins over a group", map[string]string{AnnotationSandboxID: "pod1", AnnotationGroup: "g"}, "pod1"},
		{"group outside a pod", map[string]string{AnnotationGroup: "g"}, "group:g"},
		{"group named like a pod", map[string]string{AnnotationGroup: "pod1"}, "group:pod1"},
		{"empty value ignored", map[string]string{AnnotationGroup: ""}, "t1"},
		{"empty sandbox ignored", map[string]string{AnnotationSandboxID: "", AnnotationGroup: "g"}, "group:g"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			writeSpec(t, dir, tt.annotations)
			got, err := groupOf("t1", filepath.Join(dir, "config.json"))
			if err != nil || got != tt.want {
				t.Fatalf("groupOf = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
	// A sandbox API sandbox's bundle has no spec: its shim is its own.
	if got, err := groupOf("t1", filepath.Join(t.TempDir(), "config.json")); err != nil || got != "t1" {
		t.Fatalf("groupOf without a spec = %q, %v; want t1", got, err)
	}
	bad := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(bad, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := groupOf("t1", bad); err == nil {
		t.Fatal("groupOf of a broken spec succeeded")
	}
}

// TestSocketAddress names sockets as containerd's pkg/shim does, which
// containerd and `shim delete` rely on.
func TestSocketAddress(t *testing.T) {
	ctx := namespaces.WithNamespace(context.Background(), "ns")
	want, err := shim.CreateSocketAddress(ctx, "/run/s", "/run/containerd/containerd.sock", "group:g", false)
	if err != nil {
		t.Fatal(err)
	}
	if got := "unix://" + socketPath("/run/s", "/run/containerd/containerd.sock", "ns", "group:g"); got != want {
		t.Fatalf("socket address %s, want pkg/shim's %s", got, want)
	}
}

// TestStartIsolatesPods starts tasks of two pods and tasks outside pods: a
// pod's containers share its shim whatever io.cocoon.group they carry, and
// no group annotation reaches another pod's shim or another task's.
func TestStartIsolatesPods(t *testing.T) {
	e := newEnv(t)
	tasks := []struct {
		id          string
		annotations map[string]string
		shim        string // tasks with the same letter must share a shim
	}{
		{"podA", map[string]string{AnnotationSandboxID: "podA"}, "A"},
		{"a1", map[string]string{AnnotationSandboxID: "podA", AnnotationGroup: "shared"}, "A"},
		{"podB", map[string]string{AnnotationSandboxID: "podB"}, "B"},
		{"b1", map[string]string{AnnotationSandboxID: "podB", AnnotationGroup: "podA"}, "B"},
		{"b2", map[string]string{AnnotationSandboxID: "podB", AnnotationGroup: "shared"}, "B"},
		{"t1", map[string]string{AnnotationGroup: "podA"}, "G"},
		{"t2", map[string]string{AnnotationGroup: "podA"}, "G"},
		{"t3", map[string]string{AnnotationGroup: "t4"}, "H"},
		{"t4", nil, "T"},
	}
	addrs := map[string]string{} // shim letter -> address
	seen := map[string]string{}  // address -> shim letter
	for _, task := range tasks {
		addr, bundle := e.start(t, task.id, task.annotations)
		if other, ok := seen[addr]; ok && other != task.shim {
			t.Errorf("task %s (shim %s) joined the shim of %s", task.id, task.shim, other)
		}
		if want, ok := addrs[task.shim]; ok && want != addr {
			t.Errorf("task %s did not join shim %s", task.id, task.shim)
		}
		if _, ok := seen[addr]; !ok {
			serverOf(t, bundle)
		} else if _, err := os.Stat(filepath.Join(bundle, shimtest.PIDFile)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("task %s of a running group got a server of its own (stat: %v)", task.id, err)
		}
		addrs[task.shim], seen[addr] = addr, task.shim
	}
}

// TestStartClaimsSpare: with a spare waiting, Start hands the task to it
// rather than start a server: it goes on with the task's arguments in the
// task's bundle, serving the task's socket.
func TestStartClaimsSpare(t *testing.T) {
	e := newEnv(t)
	addr1, bundle1 := e.start(t, "t1", nil)
	cold, _ := serverOf(t, bundle1)
	if err := spare.Refill(e.socketDir, e.containerd, os.Args[0], 1, os.Environ()); err != nil {
		t.Fatal(err)
	}
	path := spare.Path(e.socketDir, e.containerd, os.Args[0], 0)
	// A spare starts under SCHED_IDLE, slowly on a busy machine.
	testenv.Eventually(t, time.Minute, "a spare at "+path, func() error {
		_, err := os.Stat(path)
		return err
	})
	addr2, bundle2 := e.start(t, "t2", nil)
	pid, args := serverOf(t, bundle2)
	cmdline, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if pid == cold || !strings.Contains(string(cmdline), spare.Flag) {
		t.Fatalf("task t2's server (pid %d, %q) is not the spare", pid, cmdline)
	}
	if !strings.Contains(args, "-id t2") || !strings.Contains(args, "-namespace test") {
		t.Fatalf("spare went on with arguments %q, want t2's", args)
	}
	for _, addr := range []string{addr1, addr2} {
		c, err := net.Dial("unix", strings.TrimPrefix(addr, "unix://"))
		if err != nil {
			t.Fatalf("socket %s not served: %v", addr, err)
		}
		c.Close()
	}
}

// TestStartReplacesStaleSocket: a socket left by a crashed server is
// replaced, not taken for a running group's.
func TestStartReplacesStaleSocket(t *testing.T) {
	e := newEnv(t)
	path := socketPath(e.socketDir, e.containerd, "test", "t1")
	if err := os.MkdirAll(e.socketDir, 0o700); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	got, bundle := e.start(t, "t1", nil)
	if got != "unix://"+path {
		t.Fatalf("Start = %s, want unix://%s", got, path)
	}
	serverOf(t, bundle)
}

// A spare's environment is the server's with the launch's entries in place
// of those of their keys: an order replaces the one the server was
// started with, and an empty one clears it.
func TestWithEnv(t *testing.T) {
	for _, tc := range []struct {
		name     string
		env, set []string
		want     []string
	}{
		{"added", []string{"A=1"}, []string{"ORDER=x"}, []string{"A=1", "ORDER=x"}},
		{"replaced", []string{"ORDER=old", "A=1"}, []string{"ORDER=new"}, []string{"A=1", "ORDER=new"}},
		{"cleared", []string{"ORDER=old"}, []string{"ORDER="}, []string{"ORDER="}},
		{"a key that prefixes another kept", []string{"ORDERS=1"}, []string{"ORDER=x"}, []string{"ORDERS=1", "ORDER=x"}},
		{"nothing set", []string{"A=1"}, nil, []string{"A=1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := withEnv(tc.env, tc.set); !slices.Equal(got, tc.want) {
				t.Errorf("withEnv(%q, %q) = %q, want %q", tc.env, tc.set, got, tc.want)
			}
		})
	}
}
