package task

import (
	"context"
	"fmt"

	taskv2 "github.com/containerd/containerd/api/runtime/task/v2"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	"github.com/containerd/ttrpc"
)

// taskV2Service is the name task API v2 is served under.
const taskV2Service = "containerd.task.v2.Task"

// registerV2 serves the part of task API v2 that containerd calls when it
// falls back from v3: a Create, refused, and the clean-up after it, Delete
// and Shutdown, answered as v3 answers them. Without them, a shim that
// once answered a v3 Create with Unimplemented (which containerd takes for
// "v3 not served") was never told to exit: its v2 Delete and Shutdown were
// Unimplemented too, and the task server and its socket stayed.
func (s *Service) registerV2(server *ttrpc.Server) {
	server.RegisterService(taskV2Service, &ttrpc.ServiceDesc{Methods: map[string]ttrpc.Method{
		"Create": func(ctx context.Context, unmarshal func(any) error) (any, error) {
			var r taskv2.CreateTaskRequest
			if err := unmarshal(&r); err != nil {
				return nil, err
			}
			return nil, fmt.Errorf("create task %s over task API v2: cocoon serves task API v3 (containerd 2.0 or later): %w", r.ID, errdefs.ErrFailedPrecondition)
		},
		"Delete": func(ctx context.Context, unmarshal func(any) error) (any, error) {
			var r taskv2.DeleteRequest
			if err := unmarshal(&r); err != nil {
				return nil, err
			}
			resp, err := s.Delete(ctx, &taskAPI.DeleteRequest{ID: r.ID, ExecID: r.ExecID})
			if err != nil {
				return nil, err
			}
			return &taskv2.DeleteResponse{Pid: resp.Pid, ExitStatus: resp.ExitStatus, ExitedAt: resp.ExitedAt}, nil
		},
		"Shutdown": func(ctx context.Context, unmarshal func(any) error) (any, error) {
			var r taskv2.ShutdownRequest
			if err := unmarshal(&r); err != nil {
				return nil, err
			}
			return s.Shutdown(ctx, &taskAPI.ShutdownRequest{ID: r.ID, Now: r.Now})
		},
	}})
}
