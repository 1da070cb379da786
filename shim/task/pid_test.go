package task

import (
	"testing"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"golang.org/x/sys/unix"
)

// TestProcessPids: the init process has the hypervisor's pid, which
// containerd uses for the task; an exec has none before it starts and then
// its pid in the guest, in every response and event, or the hypervisor's
// when the guest's agent does not report pids.
func TestProcessPids(t *testing.T) {
	tests := []struct {
		name    string
		noPids  bool
		wantVMs bool // the exec reports the hypervisor's pid
	}{
		{"agent reports pids", false, false},
		{"agent without pids", true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			h.guest.noPids = tt.noPids
			vmPid := uint32(h.vm.PID())
			h.create("t1", specFor("sleep"), newFifos(t, false, false))
			if got := h.startPid("t1", ""); got != vmPid {
				t.Fatalf("init Start pid %d, want the hypervisor's %d", got, vmPid)
			}
			req := execSpec(t, "sleep")
			req.ExecID = "e1"
			if _, err := h.svc.Exec(h.ctx, req); err != nil {
				t.Fatal(err)
			}
			if got := h.statePid("t1", "e1"); got != 0 {
				t.Fatalf("created exec State pid %d, want 0", got)
			}
			got := h.startPid("t1", "e1")
			p, err := h.guest.proc("exec-e1")
			if err != nil {
				t.Fatal(err)
			}
			want := p.pid
			if tt.wantVMs {
				want = vmPid
			}
			if got != want || want == 0 {
				t.Fatalf("exec Start pid %d, want %d", got, want)
			}
			if got := h.statePid("t1", "e1"); got != want {
				t.Fatalf("exec State pid %d, want %d", got, want)
			}
			if got := h.statePid("t1", ""); got != vmPid {
				t.Fatalf("init State pid %d, want the hypervisor's %d", got, vmPid)
			}
			if _, err := h.svc.Kill(h.ctx, &taskAPI.KillRequest{ID: "t1", ExecID: "e1", Signal: uint32(unix.SIGKILL)}); err != nil {
				t.Fatal(err)
			}
			h.wait("t1", "e1")
			if got := h.delete("t1", "e1").Pid; got != want {
				t.Fatalf("exec Delete pid %d, want %d", got, want)
			}
			h.events.waitTopics(t, 5)
			for _, e := range h.events.all() {
				switch e := e.(type) {
				case *eventstypes.TaskExecStarted:
					if e.Pid != want {
						t.Fatalf("exec-started event pid %d, want %d", e.Pid, want)
					}
				case *eventstypes.TaskExit:
					if e.ID == "e1" && e.Pid != want {
						t.Fatalf("exec exit event pid %d, want %d", e.Pid, want)
					}
				case *eventstypes.TaskStart:
					if e.Pid != vmPid {
						t.Fatalf("start event pid %d, want the hypervisor's %d", e.Pid, vmPid)
					}
				}
			}
		})
	}
}

func (h *harness) startPid(id, execID string) uint32 {
	h.t.Helper()
	resp, err := h.svc.Start(h.ctx, &taskAPI.StartRequest{ID: id, ExecID: execID})
	if err != nil {
		h.t.Fatalf("Start(%q): %v", execID, err)
	}
	return resp.Pid
}

func (h *harness) statePid(id, execID string) uint32 {
	h.t.Helper()
	resp, err := h.svc.State(h.ctx, &taskAPI.StateRequest{ID: id, ExecID: execID})
	if err != nil {
		h.t.Fatalf("State(%q): %v", execID, err)
	}
	return resp.Pid
}
