package task

import (
	"context"
	"encoding/json"
	"fmt"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types/runc/options"
	ptypes "github.com/containerd/containerd/v2/pkg/protobuf/types"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Pause pauses the task's VM.
func (s *Service) Pause(ctx context.Context, r *taskAPI.PauseRequest) (*ptypes.Empty, error) {
	t, err := s.getTask(r.ID)
	if err != nil {
		return nil, err
	}
	if err := t.pause(ctx); err != nil {
		return nil, err
	}
	s.send(&eventstypes.TaskPaused{ContainerID: r.ID})
	return empty, nil
}

// Resume resumes the task's VM.
func (s *Service) Resume(ctx context.Context, r *taskAPI.ResumeRequest) (*ptypes.Empty, error) {
	t, err := s.getTask(r.ID)
	if err != nil {
		return nil, err
	}
	if err := t.resume(ctx); err != nil {
		return nil, err
	}
	s.send(&eventstypes.TaskResumed{ContainerID: r.ID})
	return empty, nil
}

// Checkpoint writes a chain link of the running VM into r.Path.
func (s *Service) Checkpoint(ctx context.Context, r *taskAPI.CheckpointTaskRequest) (*ptypes.Empty, error) {
	t, err := s.getTask(r.ID)
	if err != nil {
		return nil, err
	}
	if r.Path == "" {
		return nil, fmt.Errorf("checkpoint of %s has no path: %w", r.ID, errdefs.ErrInvalidArgument)
	}
	exit, err := checkpointExit(r)
	if err != nil {
		return nil, err
	}
	if err := t.checkpoint(ctx, r.Path, exit); err != nil {
		return nil, err
	}
	s.send(&eventstypes.TaskCheckpointed{ContainerID: r.ID})
	return empty, nil
}

// checkpointExit reads whether the task should end after the checkpoint
// (ctr task checkpoint --exit sends containerd's runc CheckpointOptions).
func checkpointExit(r *taskAPI.CheckpointTaskRequest) (bool, error) {
	if r.Options == nil || len(r.Options.GetValue()) == 0 {
		return false, nil
	}
	v, err := typeurl.UnmarshalAny(r.Options)
	if err != nil {
		return false, fmt.Errorf("decode checkpoint options: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	opts, ok := v.(*options.CheckpointOptions)
	if !ok {
		return false, fmt.Errorf("checkpoint options are %T, want containerd.runc.v1.CheckpointOptions: %w", v, errdefs.ErrInvalidArgument)
	}
	return opts.Exit, nil
}

// Stats reports the hypervisor cgroup's metrics (cgroup v1 or v2 types).
func (s *Service) Stats(ctx context.Context, r *taskAPI.StatsRequest) (*taskAPI.StatsResponse, error) {
	t, err := s.getTask(r.ID)
	if err != nil {
		return nil, err
	}
	m, err := t.stats(ctx)
	if err != nil {
		return nil, err
	}
	data, err := typeurl.MarshalAnyToProto(m)
	if err != nil {
		return nil, fmt.Errorf("encode stats: %w", err)
	}
	return &taskAPI.StatsResponse{Stats: data}, nil
}

// Update applies new resources to the hypervisor's cgroup, or to the
// guest's cgroup of a container in its pod's VM.
func (s *Service) Update(ctx context.Context, r *taskAPI.UpdateTaskRequest) (*ptypes.Empty, error) {
	t, err := s.getTask(r.ID)
	if err != nil {
		return nil, err
	}
	if r.Resources == nil {
		return nil, fmt.Errorf("update of %s has no resources: %w", r.ID, errdefs.ErrInvalidArgument)
	}
	var res specs.LinuxResources
	if err := json.Unmarshal(r.Resources.GetValue(), &res); err != nil {
		return nil, fmt.Errorf("decode resources: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	if err := t.update(ctx, &res); err != nil {
		return nil, err
	}
	return empty, nil
}

// Pids lists the processes running in the guest.
func (s *Service) Pids(ctx context.Context, r *taskAPI.PidsRequest) (*taskAPI.PidsResponse, error) {
	t, err := s.getTask(r.ID)
	if err != nil {
		return nil, err
	}
	procs, err := t.pids(ctx)
	if err != nil {
		return nil, err
	}
	return &taskAPI.PidsResponse{Processes: procs}, nil
}
