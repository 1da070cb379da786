package agent_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
)

// target is an agent to test: in-process behind a fake QEMU, or in a VM.
// Reconnect replaces c.
type target struct {
	c    *agent.Client
	dial func(ctx context.Context) (net.Conn, error)
}

// agentCases run against every target.
var agentCases = []struct {
	name string
	run  func(t *testing.T, tg *target)
}{
	{"ExitCodes", testExitCodes},
	{"User", testUser},
	{"Signal", testSignal},
	{"TerminalResize", testTerminalResize},
	{"CloseStdinEndsCat", testCloseStdin},
	{"BadInput", testBadInput},
	{"Limits", testLimits},
	{"HelperProcess", testHelperProcess},
	{"Prepared", testPrepared},
	{"ProcessesStatsDelete", testProcessesStatsDelete},
	{"HugeCommandLines", testHugeCommandLines},
	{"Reconnect", testReconnect},
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	t.Cleanup(cancel)
	return ctx
}

func procID(t *testing.T) string {
	return strings.NewReplacer("/", "-").Replace(t.Name())
}

func testExitCodes(t *testing.T, tg *target) {
	for _, tc := range []struct {
		name           string
		args           []string
		stdout, stderr string
		code, signal   int
	}{
		{"separate streams", []string{"sh", "-c", "echo out; echo err >&2"}, "out\n", "err\n", 0, 0},
		{"exit 3", []string{"sh", "-c", "exit 3"}, "", "", 3, 0},
		{"killed by signal", []string{"sh", "-c", "kill -TERM $$"}, "", "", 128 + 15, 15},
		{"env and cwd", []string{"sh", "-c", `echo "$FOO $(pwd)"`}, "bar /tmp\n", "", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := run(t, tg.c, agent.ExecRequest{ID: procID(t), Args: tc.args, Env: []string{"FOO=bar"}, Cwd: "/tmp"}, "")
			if res.stdout != tc.stdout || res.stderr != tc.stderr {
				t.Errorf("stdout %q stderr %q, want %q and %q", res.stdout, res.stderr, tc.stdout, tc.stderr)
			}
			if res.status.Code != tc.code || res.status.Signal != tc.signal {
				t.Errorf("exit %+v, want code %d signal %d", res.status, tc.code, tc.signal)
			}
		})
	}
}

func testUser(t *testing.T, tg *target) {
	for _, tc := range []struct {
		name     string
		uid, gid uint32
		want     string
	}{
		{"nobody", 65534, 65534, "65534\n65534\n65534 1\n/nonexistent\n"},
		{"uid without a passwd entry", 4242, 4343, "4242\n4343\n4343 1\n/\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := agent.ExecRequest{
				ID: procID(t), Args: []string{"sh", "-c", "id -u; id -g; id -G; echo $HOME"},
				UID: tc.uid, GID: tc.gid, AdditionalGIDs: []uint32{1},
			}
			res := run(t, tg.c, req, "")
			if res.stdout != tc.want || res.status.Code != 0 {
				t.Errorf("id: %q (stderr %q, exit %+v), want %q", res.stdout, res.stderr, res.status, tc.want)
			}
		})
	}
}

// testLimits: rlimits, the umask and no_new_privileges reach the process,
// whatever its user, and not the agent (a later process has none of them).
func testLimits(t *testing.T, tg *target) {
	umask := uint32(0o027)
	for _, tc := range []struct {
		name, script string
		req          agent.ExecRequest
		want         string
	}{
		{"limited", "ulimit -n; ulimit -Hn; umask; grep NoNewPrivs /proc/self/status", agent.ExecRequest{
			Rlimits: []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Soft: 123, Hard: 456}},
			Umask:   &umask, NoNewPrivileges: true,
		}, "123\n456\n0027\nNoNewPrivs:\t1\n"},
		{"limited user", "id -u; ulimit -n; ulimit -Hn", agent.ExecRequest{
			UID: 65534, GID: 65534, Rlimits: []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Soft: 64, Hard: 64}},
		}, "65534\n64\n64\n"},
		{"after", "umask; ulimit -Hn; grep NoNewPrivs /proc/self/status", agent.ExecRequest{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req
			req.ID, req.Args, req.Cwd = procID(t), []string{"sh", "-c", tc.script}, "/"
			res := run(t, tg.c, req, "")
			if tc.want == "" {
				if lines := strings.Split(res.stdout, "\n"); len(lines) < 3 || lines[0] == "0027" || lines[1] == "456" || lines[2] != "NoNewPrivs:\t0" {
					t.Errorf("a process without limits after limited ones: %q, want none of their limits", res.stdout)
				}
				return
			}
			if res.stdout != tc.want || res.status.Code != 0 {
				t.Errorf("limits: %q %q exit %+v, want %q", res.stdout, res.stderr, res.status, tc.want)
			}
		})
	}
}

// testHelperProcess: a process with what Go's fork cannot give keeps its
// terminal, and the pid Exec reports is the process's own.
func testHelperProcess(t *testing.T, tg *target) {
	t.Run("terminal", func(t *testing.T) {
		req := agent.ExecRequest{
			ID: procID(t), Args: []string{"sh", "-c", "tty; grep NoNewPrivs /proc/self/status"}, Cwd: "/",
			Terminal: true, NoNewPrivileges: true,
		}
		res := run(t, tg.c, req, "")
		if !strings.Contains(res.stdout, "/dev/pts/") || !strings.Contains(res.stdout, "NoNewPrivs:\t1") {
			t.Errorf("a terminal process with limits: %q, want its pty and no_new_privs", res.stdout)
		}
	})
	t.Run("pid", func(t *testing.T) {
		ctx, id := ctxT(t), procID(t)
		p, err := tg.c.Exec(ctx, agent.ExecRequest{ID: id, Args: []string{"sleep", "100"}, NoNewPrivileges: true})
		if err != nil {
			t.Fatal(err)
		}
		procs, err := tg.c.Processes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !hasProcess(procs, id, "sleep 100", p.Pid) {
			t.Errorf("processes %+v lack %s (sleep 100) with the pid %d Exec returned", procs, id, p.Pid)
		}
		if err := tg.c.Signal(ctx, id, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if _, err := tg.c.Wait(ctx, id); err != nil {
			t.Fatal(err)
		}
	})
}

// testPrepared: Init prepares a process, limits and terminal included,
// that runs only at Start, once.
func testPrepared(t *testing.T, tg *target) {
	for _, tc := range []struct {
		name string
		req  agent.ExecRequest
		want string
	}{
		{"limited", agent.ExecRequest{
			Args:    []string{"sh", "-c", "ulimit -n; grep NoNewPrivs /proc/self/status"},
			Rlimits: []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Soft: 77, Hard: 77}}, NoNewPrivileges: true,
		}, "77\nNoNewPrivs:\t1\n"},
		{"terminal", agent.ExecRequest{Args: []string{"sh", "-c", "tty >/dev/null && echo tty"}, Terminal: true}, "tty\r\n"},
		{"stdin", agent.ExecRequest{Args: []string{"cat"}, Stdin: true}, "in"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, req := ctxT(t), tc.req
			req.ID, req.Cwd = procID(t), "/"
			if _, err := tg.c.Init(ctx, agent.InitRequest{Process: &req}); err != nil {
				t.Fatal(err)
			}
			if !tg.c.Prepared(req.ID) {
				t.Fatal("Init did not prepare the process")
			}
			p, err := tg.c.Start(ctx, req.ID)
			if err != nil || p.Pid == 0 {
				t.Fatalf("start: %+v, %v", p, err)
			}
			if res := drain(t, tg.c, p, "in"); res.stdout != tc.want || res.status.Code != 0 {
				t.Errorf("printed %q (stderr %q), exit %+v; want %q and 0", res.stdout, res.stderr, res.status, tc.want)
			}
			if _, err := tg.c.Start(ctx, req.ID); !errdefs.IsNotFound(err) {
				t.Errorf("second start: %v, want not found", err)
			}
		})
	}
}

func testSignal(t *testing.T, tg *target) {
	ctx, id := ctxT(t), procID(t)
	if _, err := tg.c.Exec(ctx, agent.ExecRequest{ID: id, Args: []string{"sleep", "100"}}); err != nil {
		t.Fatal(err)
	}
	if err := tg.c.Signal(ctx, id, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	st, err := tg.c.Wait(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if st.Signal != int(syscall.SIGTERM) || st.Code != 128+int(syscall.SIGTERM) || st.ExitedAt.IsZero() {
		t.Errorf("exit %+v, want SIGTERM", st)
	}
	if err := tg.c.Signal(ctx, id, syscall.SIGTERM); !errdefs.IsNotFound(err) {
		t.Errorf("signal after exit: %v, want not found", err)
	}
}

func testTerminalResize(t *testing.T, tg *target) {
	ctx, id := ctxT(t), procID(t)
	req := agent.ExecRequest{ID: id, Args: []string{"sh", "-c", "read go; stty size"}, Terminal: true, Stdin: true}
	proc, err := tg.c.Exec(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	in, out, errOut := proc.Stdio()
	if errOut != nil {
		t.Error("a terminal process has a separate stderr")
	}
	if err := tg.c.ResizePty(ctx, id, 100, 40); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(in, "go\n"); err != nil {
		t.Fatal(err)
	}
	got := readAll(t, out)
	if !strings.Contains(got, "40 100") {
		t.Errorf("terminal output %q, want stty size 40 100", got)
	}
	if st, err := tg.c.Wait(ctx, id); err != nil || st.Code != 0 {
		t.Errorf("wait: %+v %v", st, err)
	}
	if err := tg.c.ResizePty(ctx, id, 0, 40); !errdefs.IsInvalidArgument(err) {
		t.Errorf("resize to 0 columns: %v, want invalid argument", err)
	}
}

func testCloseStdin(t *testing.T, tg *target) {
	for _, terminal := range []bool{false, true} {
		name := map[bool]string{false: "pipe", true: "terminal"}[terminal]
		t.Run(name, func(t *testing.T) {
			res := run(t, tg.c, agent.ExecRequest{ID: procID(t), Args: []string{"cat"}, Terminal: terminal, Stdin: true}, "hello\n")
			if !strings.Contains(res.stdout, "hello") || res.status.Code != 0 {
				t.Errorf("cat: stdout %q exit %+v, want hello and 0", res.stdout, res.status)
			}
		})
	}
}

func testBadInput(t *testing.T, tg *target) {
	ctx := ctxT(t)
	for _, tc := range []struct {
		name string
		req  agent.ExecRequest
		want string
	}{
		{"empty args", agent.ExecRequest{ID: "bad"}, "args are empty"},
		{"empty id", agent.ExecRequest{Args: []string{"true"}}, "id is empty"},
		{"missing cwd", agent.ExecRequest{ID: "bad", Args: []string{"true"}, Cwd: "/no/such/dir"}, `cwd "/no/such/dir" does not exist`},
		{"relative cwd", agent.ExecRequest{ID: "bad", Args: []string{"true"}, Cwd: "tmp"}, "not an absolute path"},
		{"missing binary", agent.ExecRequest{ID: "bad", Args: []string{"no-such-program"}}, `"no-such-program" not found in PATH`},
		{"missing path", agent.ExecRequest{ID: "bad", Args: []string{"/no/such/program"}}, "not found in the guest"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tg.c.Exec(ctx, tc.req)
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("exec: %v, want invalid argument saying %q", err, tc.want)
			}
			if err := tg.c.Ping(ctx); err != nil {
				t.Errorf("agent stopped serving after bad input: %v", err)
			}
		})
	}
	if _, err := tg.c.Wait(ctx, "no-such-process"); !errdefs.IsNotFound(err) {
		t.Errorf("wait for unknown process: %v, want not found", err)
	}
	if err := tg.c.Signal(ctx, "no-such-process", syscall.SIGKILL); !errdefs.IsNotFound(err) {
		t.Errorf("signal unknown process: %v, want not found", err)
	}
}

func testProcessesStatsDelete(t *testing.T, tg *target) {
	ctx, id := ctxT(t), procID(t)
	p, err := tg.c.Exec(ctx, agent.ExecRequest{ID: id, Args: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tg.c.Exec(ctx, agent.ExecRequest{ID: id, Args: []string{"true"}}); !errdefs.IsAlreadyExists(err) {
		t.Errorf("exec with a used id: %v, want already exists", err)
	}
	procs, err := tg.c.Processes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !hasProcess(procs, id, "sleep 100", p.Pid) {
		t.Errorf("processes %+v lack %s (sleep 100) with the pid %d Exec returned", procs, id, p.Pid)
	}
	if err := tg.c.Delete(ctx, id); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("delete a running process: %v, want failed precondition", err)
	}
	st, err := tg.c.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.MemoryTotal == 0 || st.MemoryAvailable == 0 || st.Uptime == 0 || st.Processes == 0 {
		t.Errorf("stats %+v have zeros", st)
	}
	if err := tg.c.Signal(ctx, id, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := tg.c.Wait(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := tg.c.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := tg.c.Wait(ctx, id); !errdefs.IsNotFound(err) {
		t.Errorf("wait after delete: %v, want not found", err)
	}
}

func hasProcess(procs agent.ProcessList, id, cmd string, pid uint32) bool {
	for _, p := range procs.Processes {
		if p.ID == id && p.Command == cmd && p.Pid == pid && pid > 1 {
			return true
		}
	}
	return false
}

// testReconnect drops the host side with a call in flight: the call fails,
// the process lives on, and a new connection controls it. Like QEMU's
// chardev, the agent serves one host at a time.
func testReconnect(t *testing.T, tg *target) {
	ctx, id := ctxT(t), procID(t)
	if _, err := tg.c.Exec(ctx, agent.ExecRequest{ID: id, Args: []string{"sleep", "100"}}); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { _, err := tg.c.Wait(ctx, id); waited <- err }()
	if err := tg.c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	tg.c.Close()
	if err := <-waited; err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("wait in flight when the host left: %v, want a prompt connection error", err)
	}
	c, err := agent.WaitReady(ctx, tg.dial)
	if err != nil {
		t.Fatal(err)
	}
	tg.c = c
	if err := c.Signal(ctx, id, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Wait(ctx, id); err != nil || st.Signal != int(syscall.SIGKILL) {
		t.Errorf("wait after reconnect: %+v %v, want SIGKILL", st, err)
	}
}
