package agent_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// oldAgent is an agent of API version 1, as in a snapshot baked before
// Init carried files, network and rootfs: it would drop them silently.
type oldAgent struct {
	api.AgentService
	inits, execs atomic.Int32
}

func (a *oldAgent) Ping(context.Context, *emptypb.Empty) (*api.PingResponse, error) {
	return &api.PingResponse{Version: "1"}, nil
}

func (a *oldAgent) Init(context.Context, *api.InitRequest) (*emptypb.Empty, error) {
	a.inits.Add(1)
	return &emptypb.Empty{}, nil
}

func (a *oldAgent) Exec(context.Context, *api.ExecRequest) (*api.ExecResponse, error) {
	a.execs.Add(1)
	return &api.ExecResponse{Pid: 1}, nil
}

// TestOldAgentRefused: what an old agent would drop is refused before it
// is sent; what it understands still works.
func TestOldAgentRefused(t *testing.T) {
	a := &oldAgent{}
	c := serveFake(t, a)
	ctx := ctxT(t)
	for name, r := range map[string]agent.InitRequest{
		"files":   {Files: []agent.File{{Path: "/etc/hosts"}}},
		"network": {Network: &agent.Network{}},
		"rootfs":  {Rootfs: &agent.Rootfs{FSType: "ext4", Serial: "s"}},
	} {
		if err := c.Init(ctx, r); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "needs guest agent API 2, the guest's agent speaks 1") {
			t.Errorf("Init with %s on an old agent: %v, want failed precondition", name, err)
		}
	}
	_, err := c.Exec(ctx, agent.ExecRequest{ID: "p", Args: []string{"true"}, Rlimits: []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE"}}})
	if !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Exec with rlimits on an old agent: %v, want failed precondition", err)
	}
	if err := c.Init(ctx, agent.InitRequest{Hostname: "h"}); err != nil {
		t.Errorf("Init of the identity on an old agent: %v", err)
	}
	if _, err := c.Exec(ctx, agent.ExecRequest{ID: "p", Args: []string{"true"}}); err != nil {
		t.Errorf("plain Exec on an old agent: %v", err)
	}
	if a.inits.Load() != 1 || a.execs.Load() != 1 {
		t.Errorf("the old agent got %d Inits and %d Execs, want only the ones it understands", a.inits.Load(), a.execs.Load())
	}
}
