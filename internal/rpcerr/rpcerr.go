// Package rpcerr decides, in one place, how cocoon's errors read on the
// wire. Code inside cocoon wraps freely — fmt.Errorf("decode spec: %w: %w",
// err, errdefs.ErrInvalidArgument) keeps both the cause and the class — and
// the RPC edges (the shim's ttrpc task service, the snapshotter's gRPC
// service) send the whole message once, classified by its errdefs class.
// Without this, errgrpc encodes every wrapped error of a %w: %w chain as a
// status detail, and the client prints the class twice.
package rpcerr

import (
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// flat is an error reduced to its message and its errdefs class.
type flat struct {
	msg string
	cls error
}

func (f flat) Error() string { return f.msg }
func (f flat) Unwrap() error { return f.cls }

// Flatten keeps err's message and its errdefs class (errdefs.ErrUnknown
// when it has none, so the wire says Unknown), and drops the rest of the
// chain. A gRPC status and nil pass unchanged.
func Flatten(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return flat{msg: err.Error(), cls: errdefs.Resolve(err)}
}

// ToGRPC is Flatten, then the gRPC status of the class.
func ToGRPC(err error) error {
	return errgrpc.ToGRPC(Flatten(err))
}

// Refusal is ToGRPC for a call whose Unimplemented answer means "this API
// is not served" to the client: containerd's task manager retries a task
// API v3 Create that answers Unimplemented with task API v2, and the
// user's error is lost on the way. There an error classed NotImplemented
// (a spec asking for what cocoon does not do) is a refusal of the input:
// FailedPrecondition, its message kept.
func Refusal(err error) error {
	wire := ToGRPC(err)
	if st, ok := status.FromError(wire); ok && st.Code() == codes.Unimplemented {
		return status.Error(codes.FailedPrecondition, st.Message())
	}
	return wire
}
