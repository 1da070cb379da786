package server

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

const limitsScript = "id -u; umask; ulimit -n; ulimit -Hn; grep NoNewPrivs /proc/self/status"

// limited runs limitsScript with every setting Go's fork cannot give.
func limited(id string) *api.ExecRequest {
	umask := uint32(0o027)
	return &api.ExecRequest{
		Id: id, Args: []string{"sh", "-c", limitsScript}, Cwd: "/", Uid: 65534, Gid: 65534,
		Rlimits:         []*api.Rlimit{{Type: "RLIMIT_NOFILE", Soft: 77, Hard: 88}},
		Umask:           &umask,
		NoNewPrivileges: true,
	}
}

const limitedOutput = "65534\n0027\n77\n88\nNoNewPrivs:\t1\n"

// output reads process id's stdout to its end and waits for its exit code.
func output(t *testing.T, s *Service, id string) (string, int32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var b strings.Builder
	for {
		r, err := s.ReadOutput(ctx, &api.ReadOutputRequest{Id: id, Stream: api.Stream_STDOUT})
		if err != nil {
			t.Fatalf("read output of %s: %v", id, err)
		}
		b.Write(r.Data)
		if r.Eof {
			break
		}
	}
	w, err := s.Wait(ctx, &api.ProcessRequest{Id: id})
	if err != nil {
		t.Fatalf("wait for %s: %v", id, err)
	}
	return b.String(), w.ExitCode
}

// waitState waits until pid is in state (its letter in /proc).
func waitState(t *testing.T, pid int, state string) {
	t.Helper()
	testenv.Eventually(t, time.Minute, fmt.Sprintf("process %d in state %q", pid, state), func() error {
		stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))[0]; got != state {
			return fmt.Errorf("in state %q", got)
		}
		return nil
	})
}

// TestForkedLimits: a process gets its user, umask, rlimits and
// no_new_privileges; none of them reaches the agent or a later process.
func TestForkedLimits(t *testing.T) {
	testenv.RequireRoot(t) // processes get credentials of their own
	s := New(&fakeSystem{j: &journal{}})
	ctx := context.Background()
	if _, err := s.Exec(ctx, limited("limited")); err != nil {
		t.Fatal(err)
	}
	if out, code := output(t, s, "limited"); out != limitedOutput || code != 0 {
		t.Errorf("limited process printed %q, exit %d; want %q and 0", out, code, limitedOutput)
	}
	plain := &api.ExecRequest{Id: "plain", Args: []string{"sh", "-c", limitsScript}, Cwd: "/"}
	if _, err := s.Exec(ctx, plain); err != nil {
		t.Fatal(err)
	}
	out, _ := output(t, s, "plain")
	if lines := strings.Split(out, "\n"); len(lines) < 5 || lines[0] != "0" || lines[1] == "0027" || lines[3] == "88" || lines[4] != "NoNewPrivs:\t0" {
		t.Errorf("a plain process after a limited one printed %q, want none of its settings", out)
	}
	// Processes forked from one thread (a forker's) get only the umask
	// each asks for.
	mask := unix.Umask(0)
	unix.Umask(mask)
	umask := uint32(0o027)
	for _, tc := range []struct {
		umask *uint32
		want  string
	}{{&umask, "0027\n"}, {nil, fmt.Sprintf("%04o\n", mask)}} {
		r := &api.ExecRequest{Id: fmt.Sprint("masked", tc.want), Args: []string{"sh", "-c", "umask"}, Cwd: "/", NoNewPrivileges: true, Umask: tc.umask}
		if _, err := s.Exec(ctx, r); err != nil {
			t.Fatal(err)
		}
		if out, _ := output(t, s, r.Id); out != tc.want {
			t.Errorf("a process asking for umask %v has %q, want %q", tc.umask, out, tc.want)
		}
	}
}

// TestExecFails: a program the kernel cannot exec fails Exec and leaves
// no process behind.
func TestExecFails(t *testing.T) {
	testenv.RequireRoot(t)
	prog := filepath.Join(t.TempDir(), "prog")
	if err := os.WriteFile(prog, []byte("not a program"), 0o755); err != nil {
		t.Fatal(err)
	}
	s := New(&fakeSystem{j: &journal{}})
	req := limited("a")
	req.Args, req.Uid, req.Gid = []string{prog}, 0, 0
	if _, err := s.Exec(context.Background(), req); err == nil || !strings.Contains(err.Error(), "exec format error") {
		t.Errorf("exec of a file that is no program: %v, want exec format error", err)
	}
	if _, err := s.Wait(context.Background(), &api.ProcessRequest{Id: "a"}); !errdefs.IsNotFound(err) {
		t.Errorf("wait after the failed exec: %v, want not found", err)
	}
}

// TestPreparedProcess: Init's process is exec'd and held before its first
// instruction until Start, which lets it run once; signals wait for Start
// too.
func TestPreparedProcess(t *testing.T) {
	testenv.RequireRoot(t)
	s := New(&fakeSystem{j: &journal{}})
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		req  *api.ExecRequest
		want string
	}{
		{"limited", limited("limited"), limitedOutput},
		{"plain", &api.ExecRequest{Id: "plain", Args: []string{"echo", "started"}, Cwd: "/"}, "started\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := s.Init(ctx, &api.InitRequest{Process: tc.req}); err != nil {
				t.Fatal(err)
			}
			p, err := s.process(tc.req.Id)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.fork.wait(); err != nil {
				t.Fatal(err)
			}
			waitState(t, p.pid(), "T")
			rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer cancel()
			if r, err := s.ReadOutput(rctx, &api.ReadOutputRequest{Id: tc.req.Id}); err == nil {
				t.Errorf("a held process wrote %q before Start", r.Data)
			}
			if _, err := s.Signal(ctx, &api.SignalRequest{Id: tc.req.Id, Signal: 15}); !errdefs.IsFailedPrecondition(err) {
				t.Errorf("signal before Start: %v, want failed precondition", err)
			}
			resp, err := s.Start(ctx, &api.ProcessRequest{Id: tc.req.Id})
			if err != nil || int(resp.Pid) != p.pid() {
				t.Fatalf("start: %+v, %v; want pid %d", resp, err, p.pid())
			}
			if out, code := output(t, s, tc.req.Id); out != tc.want || code != 0 {
				t.Errorf("printed %q, exit %d; want %q and 0", out, code, tc.want)
			}
			if _, err := s.Start(ctx, &api.ProcessRequest{Id: tc.req.Id}); !errdefs.IsFailedPrecondition(err) {
				t.Errorf("second Start: %v, want failed precondition", err)
			}
		})
	}
}

// TestPreparedProcessFails: what only the fork finds wrong with Init's
// process fails Start, and the process exits 127.
func TestPreparedProcessFails(t *testing.T) {
	testenv.RequireRoot(t)
	prog := filepath.Join(t.TempDir(), "prog")
	if err := os.WriteFile(prog, []byte("not a program"), 0o755); err != nil {
		t.Fatal(err)
	}
	s := New(&fakeSystem{j: &journal{}})
	ctx := context.Background()
	if _, err := s.Init(ctx, &api.InitRequest{Process: &api.ExecRequest{Id: "p", Args: []string{prog}, Cwd: "/"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(ctx, &api.ProcessRequest{Id: "p"}); err == nil || !strings.Contains(err.Error(), "exec format error") {
		t.Errorf("start: %v, want exec format error", err)
	}
	if w, err := s.Wait(ctx, &api.ProcessRequest{Id: "p"}); err != nil || w.ExitCode != 127 {
		t.Errorf("wait: %+v, %v; want exit 127", w, err)
	}
}

// TestPreparedProcessGivenUp: Delete kills a prepared process that never
// started.
func TestPreparedProcessGivenUp(t *testing.T) {
	testenv.RequireRoot(t)
	s := New(&fakeSystem{j: &journal{}})
	ctx := context.Background()
	if _, err := s.Init(ctx, &api.InitRequest{Process: limited("p")}); err != nil {
		t.Fatal(err)
	}
	p, err := s.process("p")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Delete(ctx, &api.ProcessRequest{Id: "p"}); err != nil {
		t.Fatalf("delete before Start: %v", err)
	}
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		t.Fatal("the given up process was never reaped")
	}
	if p.status.signal != 9 {
		t.Errorf("given up process ended %+v, want killed", p.status)
	}
	if _, err := s.Start(ctx, &api.ProcessRequest{Id: "p"}); !errdefs.IsNotFound(err) {
		t.Errorf("start after Delete: %v, want not found", err)
	}
}

// TestHeldProcessDetached: a process Init prepared but nothing started
// (a snapshot's) is killed when the next Init detaches what the guest
// inherited.
func TestHeldProcessDetached(t *testing.T) {
	testenv.RequireRoot(t)
	s := New(&fakeSystem{j: &journal{}})
	ctx := context.Background()
	if _, err := s.Init(ctx, &api.InitRequest{Process: limited("held")}); err != nil {
		t.Fatal(err)
	}
	p, err := s.process("held")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Init(ctx, &api.InitRequest{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		t.Fatal("the held process outlived the Init that detached it")
	}
	if p.status.signal != 9 {
		t.Errorf("held process ended %+v, want killed", p.status)
	}
}
