package agent_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/pause"
)

// oldAgent is an agent of an API version before 3, as in a snapshot baked
// before Init told its version: its Init answers nothing. Version 1 drops
// Init's files, network and rootfs silently; both drop its process.
type oldAgent struct {
	api.AgentService
	version             string
	inits, execs, pings atomic.Int32
}

func (a *oldAgent) Ping(context.Context, *emptypb.Empty) (*api.PingResponse, error) {
	a.pings.Add(1)
	return &api.PingResponse{Version: a.version}, nil
}

func (a *oldAgent) Init(context.Context, *api.InitRequest) (*api.InitResponse, error) {
	a.inits.Add(1)
	return &api.InitResponse{}, nil
}

func (a *oldAgent) Exec(context.Context, *api.ExecRequest) (*api.ExecResponse, error) {
	a.execs.Add(1)
	return &api.ExecResponse{Pid: 1}, nil
}

// TestOldAgentRefused: what an old agent dropped fails Init, whose answer
// does not tell the version, so Init asks it; what the agent understands
// still works, and once its version is known what it would drop is
// refused before it is sent.
func TestOldAgentRefused(t *testing.T) {
	a := &oldAgent{version: "1"}
	c := serveFake(t, a)
	ctx := ctxT(t)
	for name, r := range map[string]agent.InitRequest{
		"files":   {Files: []agent.File{{Path: "/etc/hosts"}}},
		"network": {Network: &agent.Network{}},
		"rootfs":  {Rootfs: &agent.Rootfs{FSType: "ext4", Serial: "s"}},
	} {
		if _, err := c.Init(ctx, r); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "needs guest agent API 2, the guest's agent speaks 1") {
			t.Errorf("Init with %s on an old agent: %v, want failed precondition", name, err)
		}
	}
	_, err := c.Exec(ctx, agent.ExecRequest{ID: "p", Args: []string{"true"}, Rlimits: []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE"}}})
	if !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Exec with rlimits on an old agent: %v, want failed precondition", err)
	}
	if _, err := c.Init(ctx, agent.InitRequest{Hostname: "h"}); err != nil {
		t.Errorf("Init of the identity on an old agent: %v", err)
	}
	if _, err := c.Exec(ctx, agent.ExecRequest{ID: "p", Args: []string{"true"}}); err != nil {
		t.Errorf("plain Exec on an old agent: %v", err)
	}
	if _, err := c.Init(ctx, agent.InitRequest{Files: []agent.File{{Path: "/etc/hosts"}}}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Init with files on an old agent of known version: %v, want failed precondition", err)
	}
	// The first Init learnt the version; every later one it would drop
	// was refused before it was sent.
	if a.inits.Load() != 2 || a.execs.Load() != 1 {
		t.Errorf("the old agent got %d Inits and %d Execs, want 2 and 1", a.inits.Load(), a.execs.Load())
	}
}

// TestOldAgentExecsWhatInitWouldPrepare: an agent before API 3 ignores
// Init's process, so the client does not take it as prepared: the process
// is Exec'd instead.
func TestOldAgentExecsWhatInitWouldPrepare(t *testing.T) {
	a := &oldAgent{version: "2"}
	c := serveFake(t, a)
	ctx := ctxT(t)
	p := agent.ExecRequest{ID: "init", Args: []string{"true"}}
	if _, err := c.Init(ctx, agent.InitRequest{Hostname: "h", Process: &p}); err != nil {
		t.Fatal(err)
	}
	if c.Prepared("init") {
		t.Error("Prepared after an Init the agent answered without a version, want false")
	}
	if _, err := c.Start(ctx, "init"); !errdefs.IsNotFound(err) {
		t.Errorf("Start of a process the agent did not prepare: %v, want not found", err)
	}
}

// version5Agent answers Init with its version, as agents of API 3 to 5 do,
// and drops the sysctls it does not know.
type version5Agent struct{ oldAgent }

func (a *version5Agent) Init(context.Context, *api.InitRequest) (*api.InitResponse, error) {
	a.inits.Add(1)
	return &api.InitResponse{Version: "5"}, nil
}

// TestSysctlsNeedVersion6: an agent of API 5 ignores Init's sysctls, so
// the Init that carried them fails, naming what was dropped.
func TestSysctlsNeedVersion6(t *testing.T) {
	c := serveFake(t, &version5Agent{oldAgent{version: "5"}})
	_, err := c.Init(ctxT(t), agent.InitRequest{Sysctls: map[string]string{"kernel.shm_rmid_forced": "1"}})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "sysctls needs guest agent API 6, the guest's agent speaks 5") {
		t.Errorf("Init with sysctls on an agent of API 5: %v, want failed precondition naming sysctls and both versions", err)
	}
}

// TestSeccompNeedsVersion10: an agent of API 9 would start the process
// without its filter, so an Exec or Init asking for one fails, naming it
// and both versions, and no Exec reaches the agent.
func TestSeccompNeedsVersion10(t *testing.T) {
	a := &oldAgent{version: "9"}
	c := serveFake(t, a)
	p := agent.ExecRequest{ID: "p", Args: []string{"true"}, Seccomp: &specs.LinuxSeccomp{DefaultAction: specs.ActAllow}}
	want := "a seccomp filter needs guest agent API 10, the guest's agent speaks 9"
	if _, err := c.Exec(ctxT(t), p); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), want) {
		t.Errorf("Exec with a filter on an agent of API 9: %v, want failed precondition: %s", err, want)
	}
	if a.execs.Load() != 0 {
		t.Errorf("the agent got %d Execs, want none", a.execs.Load())
	}
	if _, err := c.Init(ctxT(t), agent.InitRequest{Process: &p}); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), want) {
		t.Errorf("Init with a filter on an agent of API 9: %v, want failed precondition: %s", err, want)
	}
}

// pauseAgent answers Init as an agent of its version does when the
// process is the guest's own pause: one of API 12 starts it, an older one
// cannot find its program.
type pauseAgent struct{ oldAgent }

func (a *pauseAgent) Init(context.Context, *api.InitRequest) (*api.InitResponse, error) {
	a.inits.Add(1)
	if v, _ := strconv.Atoi(a.version); v < 12 {
		return nil, errgrpc.ToGRPC(fmt.Errorf("init process: program %q not found: %w", pause.Path, errdefs.ErrInvalidArgument))
	}
	return &api.InitResponse{Version: a.version}, nil
}

// TestPauseNeedsVersion12: an Init whose process is the guest's own pause
// fails on an agent before API 12 naming what it needs and both versions;
// on one of API 12 it costs no Ping.
func TestPauseNeedsVersion12(t *testing.T) {
	p := &agent.ExecRequest{ID: "init", Args: []string{pause.Path}}
	old := &pauseAgent{oldAgent{version: "11"}}
	want := "the guest's own pause process needs guest agent API 12, the guest's agent speaks 11"
	if _, err := serveFake(t, old).Init(ctxT(t), agent.InitRequest{Process: p}); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), want) {
		t.Errorf("Init of the pause on an agent of API 11: %v, want failed precondition: %s", err, want)
	}
	cur := &pauseAgent{oldAgent{version: "12"}}
	if _, err := serveFake(t, cur).Init(ctxT(t), agent.InitRequest{Process: p}); err != nil || cur.pings.Load() != 0 {
		t.Errorf("Init of the pause on an agent of API 12: %v after %d pings, want none", err, cur.pings.Load())
	}
}
