package task

import (
	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/ttrpc"
	"github.com/containerd/typeurl/v2"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// WarmCodecs readies the protobuf codecs of a task's start: the ttrpc
// frames, the Create and Start calls and their events. The protobuf runtime
// builds each message type's codec on its first use, by reflection —
// otherwise on the first Create's path. A spare server calls it while it
// waits (package spare).
func WarmCodecs() {
	for _, m := range []proto.Message{
		&ttrpc.Request{}, &ttrpc.Response{},
		&taskAPI.CreateTaskRequest{Rootfs: []*types.Mount{{}}, Options: &anypb.Any{}}, &taskAPI.CreateTaskResponse{},
		&taskAPI.StartRequest{}, &taskAPI.StartResponse{},
		&taskAPI.StateRequest{}, &taskAPI.StateResponse{},
		&types.Envelope{}, &eventstypes.TaskCreate{IO: &eventstypes.TaskIO{}}, &eventstypes.TaskStart{},
	} {
		if data, err := proto.Marshal(m); err == nil {
			_ = proto.Unmarshal(data, m)
		}
		// Events go to containerd as Any.
		_, _ = typeurl.MarshalAnyToProto(m)
	}
}
