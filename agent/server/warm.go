package server

import (
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// warmUp makes the forkers, opens /dev/null, has os check its pidfd
// support (a fork: see settleForkCheck) and builds the codecs of the
// API's messages, which protobuf builds on a type's first use. The agent
// does it as it starts, so that a snapshot carries them: a restored clone
// would otherwise make them after every restore, in code the guest's CPU
// has yet to translate.
func warmUp() {
	forkers()
	_, _ = devNull()
	settleForkCheck()
	msgs := api.File_agent_proto.Messages()
	types := []protoreflect.MessageType{(&emptypb.Empty{}).ProtoReflect().Type(), (&timestamppb.Timestamp{}).ProtoReflect().Type()}
	for i := range msgs.Len() {
		if mt, err := protoregistry.GlobalTypes.FindMessageByName(msgs.Get(i).FullName()); err == nil {
			types = append(types, mt)
		}
	}
	for _, mt := range types {
		m := mt.New().Interface()
		if b, err := proto.Marshal(m); err == nil {
			_ = proto.Unmarshal(b, m)
		}
	}
}
