package agent_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// stuckAgent answers Exec but holds every WriteStdin, as the agent of a
// paused VM would; CloseStdin answers and reports whether its caller
// bounded it. Other methods are not served.
type stuckAgent struct {
	api.AgentService
	writing chan struct{} // a WriteStdin arrived
	release chan struct{} // closed to let held writes go
	closed  chan bool     // a CloseStdin arrived; true if it had a deadline
}

func (a *stuckAgent) Exec(context.Context, *api.ExecRequest) (*api.ExecResponse, error) {
	return &api.ExecResponse{Pid: 1}, nil
}

func (a *stuckAgent) WriteStdin(ctx context.Context, _ *api.WriteStdinRequest) (*emptypb.Empty, error) {
	a.writing <- struct{}{}
	select {
	case <-a.release:
	case <-ctx.Done():
	}
	return &emptypb.Empty{}, nil
}

func (a *stuckAgent) CloseStdin(ctx context.Context, _ *api.ProcessRequest) (*emptypb.Empty, error) {
	_, bounded := ctx.Deadline()
	a.closed <- bounded
	return &emptypb.Empty{}, nil
}

// serveFake serves a on a unix socket and returns a client of it.
func serveFake(t *testing.T, a api.AgentService) *agent.Client {
	t.Helper()
	dir, err := os.MkdirTemp("", "cocoon-stuck-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ln, err := net.Listen("unix", filepath.Join(dir, "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ttrpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	api.RegisterAgentService(srv, a)
	served := make(chan struct{})
	go func() { _ = srv.Serve(context.Background(), ln); close(served) }()
	conn, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := agent.NewClient(conn)
	t.Cleanup(func() {
		_ = c.Close()
		_ = srv.Close()
		<-served
	})
	return c
}

// TestStdinCloseInterruptsWrite closes a stdin whose write the agent does
// not answer: the write must end, and the close must be bounded.
func TestStdinCloseInterruptsWrite(t *testing.T) {
	a := &stuckAgent{writing: make(chan struct{}, 1), release: make(chan struct{}), closed: make(chan bool, 1)}
	c := serveFake(t, a)
	t.Cleanup(func() { close(a.release) })
	ctx := ctxT(t)
	proc, err := c.Exec(ctx, agent.ExecRequest{ID: "p", Args: []string{"cat"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	in, _, _ := proc.Stdio()
	wrote := make(chan error, 1)
	go func() {
		_, err := in.Write([]byte("data"))
		wrote <- err
	}()
	<-a.writing
	if err := in.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-wrote:
		if !errors.Is(err, os.ErrClosed) {
			t.Errorf("write interrupted by Close: %v, want os.ErrClosed", err)
		}
	case <-ctx.Done():
		t.Fatal("Close left a stdin write hanging")
	}
	if bounded := <-a.closed; !bounded {
		t.Error("CloseStdin was sent without a deadline")
	}
}
