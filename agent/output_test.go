package agent_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// oddOutputAgent answers every ReadOutput with reply; other methods but
// Exec are not served.
type oddOutputAgent struct {
	api.AgentService
	reply *api.ReadOutputResponse
	reads atomic.Int32
}

func (a *oddOutputAgent) Exec(context.Context, *api.ExecRequest) (*api.ExecResponse, error) {
	return &api.ExecResponse{Pid: 1}, nil
}

func (a *oddOutputAgent) ReadOutput(context.Context, *api.ReadOutputRequest) (*api.ReadOutputResponse, error) {
	a.reads.Add(1)
	return a.reply, nil
}

// TestOutputFromBrokenGuest: a guest answering reads with neither data nor
// end of stream, or with more than was asked for, fails the read instead
// of making the host spin or lose bytes silently.
func TestOutputFromBrokenGuest(t *testing.T) {
	for _, tc := range []struct {
		name      string
		reply     *api.ReadOutputResponse
		wantReads int32
		want      string
	}{
		{"empty replies without EOF", &api.ReadOutputResponse{}, 8, "8 reads with neither data nor end of stream"},
		{"more than asked for", &api.ReadOutputResponse{Data: make([]byte, 100)}, 1, "sent 100 bytes, 10 were asked for"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &oddOutputAgent{reply: tc.reply}
			c := serveFake(t, a)
			ctx := ctxT(t)
			proc, err := c.Exec(ctx, agent.ExecRequest{ID: "p", Args: []string{"true"}})
			if err != nil {
				t.Fatal(err)
			}
			_, out, _ := proc.Stdio()
			read := make(chan error, 1)
			go func() {
				_, err := out.Read(make([]byte, 10))
				read <- err
			}()
			select {
			case err = <-read:
			case <-time.After(callTimeout):
				t.Fatalf("read still spinning after %v, %d ReadOutput calls", callTimeout, a.reads.Load())
			}
			if !errdefs.IsDataLoss(err) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("read: %v, want data loss saying %q", err, tc.want)
			}
			if n := a.reads.Load(); n != tc.wantReads {
				t.Errorf("%d ReadOutput calls, want %d", n, tc.wantReads)
			}
		})
	}
}
