package agent_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"unicode/utf8"

	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/server"
)

// hostileService is served beside the agent's API to answer what no agent
// call can any more: a reply larger than a ttrpc message, and an error
// whose message is not UTF-8, which ttrpc cannot marshal.
const hostileService = "cocoon.test.Hostile"

// TestRepliesTTRPCCannotSend: each such reply fails its own call, and the
// session answers the next one. Without the agent's bound, ttrpc drops the
// connection and the host's calls wait until their deadlines.
func TestRepliesTTRPCCannotSend(t *testing.T) {
	tc := hostileSession(t)
	agentAPI := api.NewAgentClient(tc)
	for _, c := range []struct {
		method string
		code   codes.Code
	}{
		{"Big", codes.ResourceExhausted},
		{"NotUTF8", codes.Unknown},
	} {
		t.Run(c.method, func(t *testing.T) {
			ctx := ctxT(t)
			err := tc.Call(ctx, hostileService, c.method, &emptypb.Empty{}, &api.ReadOutputResponse{})
			if st, ok := status.FromError(err); !ok || st.Code() != c.code || !utf8.ValidString(st.Message()) {
				t.Errorf("%s: %v, want a %v status", c.method, err, c.code)
			}
			if _, err := agentAPI.Ping(ctx, &emptypb.Empty{}); err != nil {
				t.Errorf("ping after %s: %v", c.method, err)
			}
		})
	}
}

// hostileSession serves the agent with hostileService in-process behind a
// fake QEMU and returns a ttrpc client on a session to it.
func hostileSession(t *testing.T) *ttrpc.Client {
	t.Helper()
	dir, err := os.MkdirTemp("", "cocoon-hostile-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.NewTTRPCServer(server.New(&fakeSystem{off: make(chan struct{})}))
	if err != nil {
		t.Fatal(err)
	}
	srv.RegisterService(hostileService, &ttrpc.ServiceDesc{Methods: map[string]ttrpc.Method{
		"Big": func(context.Context, func(any) error) (any, error) {
			return &api.ReadOutputResponse{Data: make([]byte, 5<<20)}, nil
		},
		"NotUTF8": func(context.Context, func(any) error) (any, error) {
			return nil, fmt.Errorf("exec %s: not found", "\xff\xfe")
		},
	}})
	l := agent.ListenSerial(newFakeQEMU(ln))
	served := make(chan struct{})
	go func() { _ = srv.Serve(context.Background(), l); close(served) }()
	t.Cleanup(func() {
		_ = srv.Close()
		_ = l.Close()
		<-served
	})
	conn, err := agent.DialUnix(ctxT(t), sock)
	if err != nil {
		t.Fatal(err)
	}
	tc := ttrpc.NewClient(conn)
	t.Cleanup(func() { _ = tc.Close() })
	return tc
}
