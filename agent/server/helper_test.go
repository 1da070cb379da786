package server

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// limited runs script with the limits only the exec helper sets.
func limited(id, script string) *api.ExecRequest {
	return &api.ExecRequest{
		Id: id, Args: []string{"sh", "-c", script}, Cwd: "/",
		Rlimits:         []*api.Rlimit{{Type: "RLIMIT_NOFILE", Soft: 77, Hard: 77}},
		NoNewPrivileges: true,
	}
}

const limitsScript = "ulimit -n; grep NoNewPrivs /proc/self/status"

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

func spareService(t *testing.T) (*Service, int) {
	t.Helper()
	testenv.RequireRoot(t) // the helper sets the process's credentials
	s := New(&fakeSystem{j: &journal{}})
	if err := s.StartSpare(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, s.spare.cmd.Process.Pid
}

// TestSpareHelper: the spare is no process of the guest's; the first
// process that needs the exec helper becomes the spare (same pid) with its
// limits; the next one starts a helper of its own.
func TestSpareHelper(t *testing.T) {
	s, spare := spareService(t)
	procs, err := s.Processes(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs.Processes {
		if int(p.Pid) == spare {
			t.Errorf("processes list the spare helper: %+v", p)
		}
	}
	for i, id := range []string{"first", "second"} {
		resp, err := s.Exec(context.Background(), limited(id, limitsScript))
		if err != nil {
			t.Fatal(err)
		}
		if tookSpare := int(resp.Pid) == spare; tookSpare != (i == 0) {
			t.Errorf("%s process has pid %d, the spare %d: want only the first to be the spare", id, resp.Pid, spare)
		}
		if out, code := output(t, s, id); out != "77\nNoNewPrivs:\t1\n" || code != 0 {
			t.Errorf("%s process printed %q, exit %d; want its limits and 0", id, out, code)
		}
	}
}

// TestDeadSpareHelper: a spare that died is replaced by a new helper.
func TestDeadSpareHelper(t *testing.T) {
	s, spare := spareService(t)
	if err := syscall.Kill(spare, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Exec(context.Background(), limited("p", limitsScript)); err != nil {
		t.Fatal(err)
	}
	if out, code := output(t, s, "p"); out != "77\nNoNewPrivs:\t1\n" || code != 0 {
		t.Errorf("printed %q, exit %d; want the limits and 0", out, code)
	}
}

// TestPreparedProcess: Init's process runs only at Start, once; with or
// without a helper.
func TestPreparedProcess(t *testing.T) {
	s, _ := spareService(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		req  *api.ExecRequest
		want string
	}{
		{"helper", limited("helper", "echo started; "+limitsScript), "started\n77\nNoNewPrivs:\t1\n"},
		{"plain", &api.ExecRequest{Id: "plain", Args: []string{"echo", "started"}, Cwd: "/"}, "started\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := s.Init(ctx, &api.InitRequest{Process: tc.req}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Signal(ctx, &api.SignalRequest{Id: tc.req.Id, Signal: 15}); !errdefs.IsFailedPrecondition(err) {
				t.Errorf("signal before Start: %v, want failed precondition", err)
			}
			if _, err := s.Start(ctx, &api.ProcessRequest{Id: tc.req.Id}); err != nil {
				t.Fatal(err)
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

// TestPreparedProcessGivenUp: a prepared process that never starts is
// given up by Delete, with or without a helper.
func TestPreparedProcessGivenUp(t *testing.T) {
	s, _ := spareService(t)
	ctx := context.Background()
	for _, req := range []*api.ExecRequest{
		limited("helper", "echo never"),
		{Id: "plain", Args: []string{"echo", "never"}, Cwd: "/"},
	} {
		if _, err := s.Init(ctx, &api.InitRequest{Process: req}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Delete(ctx, &api.ProcessRequest{Id: req.Id}); err != nil {
			t.Errorf("delete %s before Start: %v", req.Id, err)
		}
		if _, err := s.Start(ctx, &api.ProcessRequest{Id: req.Id}); !errdefs.IsNotFound(err) {
			t.Errorf("start %s after Delete: %v, want not found", req.Id, err)
		}
	}
}
