package task

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	taskv2 "github.com/containerd/containerd/api/runtime/task/v2"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	"github.com/containerd/ttrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// serve serves h's task service on a ttrpc socket as pkg/shim does (its
// interceptor, its services) and returns a client connection to it.
func (h *harness) serve() *ttrpc.Client {
	h.t.Helper()
	server, err := ttrpc.NewServer(ttrpc.WithUnaryServerInterceptor(h.svc.UnaryServerInterceptor()))
	if err != nil {
		h.t.Fatal(err)
	}
	if err := h.svc.RegisterTTRPC(server); err != nil {
		h.t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(h.t.TempDir(), "s"))
	if err != nil {
		h.t.Fatal(err)
	}
	go server.Serve(context.Background(), l)
	conn, err := net.Dial("unix", l.Addr().String())
	if err != nil {
		h.t.Fatal(err)
	}
	c := ttrpc.NewClient(conn)
	h.t.Cleanup(func() {
		c.Close()
		server.Close()
	})
	return c
}

// TestCreateRefusalOnTheWire: a Create refused for what its spec asks
// reaches containerd as FailedPrecondition or InvalidArgument with the
// reason, never as Unimplemented (containerd's "task API v3 not served").
func TestCreateRefusalOnTheWire(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(h *harness, r *taskAPI.CreateTaskRequest)
		code   codes.Code
		want   string
	}{
		{"startContainer hook", func(h *harness, r *taskAPI.CreateTaskRequest) {
			s := specFor("true")
			s.Hooks = &specs.Hooks{StartContainer: []specs.Hook{{Path: "/bin/hook"}}}
			r.Bundle = h.bundle(s)
		}, codes.InvalidArgument, "startContainer hook(s) (first /bin/hook)"},
		{"launcher says not implemented", func(h *harness, r *taskAPI.CreateTaskRequest) {
			h.launcher.err = fmt.Errorf(`mount type "nfs": %w`, errdefs.ErrNotImplemented)
		}, codes.FailedPrecondition, `mount type "nfs"`},
		{"agent status Unimplemented", func(h *harness, r *taskAPI.CreateTaskRequest) {
			h.launcher.err = fmt.Errorf("init rootfs: %w", status.Error(codes.Unimplemented, `type "nfs" is not supported in the guest`))
		}, codes.FailedPrecondition, `type "nfs" is not supported`},
		{"from checkpoint", func(h *harness, r *taskAPI.CreateTaskRequest) { r.Checkpoint = "/tmp/cp" }, codes.InvalidArgument, "/tmp/cp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			c := taskAPI.NewTTRPCTaskClient(h.serve())
			r := &taskAPI.CreateTaskRequest{ID: "t1", Bundle: h.bundle(specFor("true")), Rootfs: h.rootfs()}
			tc.mutate(h, r)
			_, err := c.Create(h.ctx, r)
			if st, _ := status.FromError(err); st.Code() != tc.code || !strings.Contains(st.Message(), tc.want) {
				t.Fatalf("Create answers %v, want code %v and a message naming %q", err, tc.code, tc.want)
			}
		})
	}
}

// TestTaskV2CleanUp: containerd's fallback to task API v2 (a Create, then
// Delete and Shutdown to clean up) is refused, then cleaned up: the shim
// shuts down.
func TestTaskV2CleanUp(t *testing.T) {
	h := newHarness(t)
	c := taskv2.NewTTRPCTaskClient(h.serve())
	// containerd's context, not the shim's, which its shutdown cancels.
	ctx := context.Background()
	_, err := c.Create(ctx, &taskv2.CreateTaskRequest{ID: "t1", Bundle: h.bundle(specFor("true"))})
	if st, _ := status.FromError(err); st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), "task API v3") {
		t.Fatalf("v2 Create answers %v, want FailedPrecondition saying cocoon serves task API v3", err)
	}
	if _, err := c.Delete(ctx, &taskv2.DeleteRequest{ID: "t1"}); status.Code(err) != codes.NotFound {
		t.Fatalf("v2 Delete answers %v, want NotFound", err)
	}
	if _, err := c.Shutdown(ctx, &taskv2.ShutdownRequest{ID: "t1"}); err != nil {
		t.Fatalf("v2 Shutdown: %v", err)
	}
	select {
	case <-h.svc.sd.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the shim did not shut down after v2 Shutdown")
	}
}
