package rpcerr

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestWire: what a client reads back after ToGRPC: the message once, the
// class intact, whatever the chain's shape.
func TestWire(t *testing.T) {
	cause := errors.New("unexpected EOF")
	for _, tc := range []struct {
		name     string
		err      error
		code     codes.Code
		want     string
		wantIs   error
		notTwice string
	}{
		{"double wrap", fmt.Errorf("decode spec: %w: %w", cause, errdefs.ErrInvalidArgument), codes.InvalidArgument,
			"decode spec: unexpected EOF: invalid argument", errdefs.ErrInvalidArgument, "invalid argument"},
		{"single wrap", fmt.Errorf("task t1: %w", errdefs.ErrNotFound), codes.NotFound, "task t1: not found", errdefs.ErrNotFound, "not found"},
		{"joined", errors.Join(fmt.Errorf("a: %w", errdefs.ErrFailedPrecondition), errors.New("b")), codes.FailedPrecondition,
			"a: failed precondition\nb", errdefs.ErrFailedPrecondition, ""},
		{"unclassified", errors.New("boom"), codes.Unknown, "boom", errdefs.ErrUnknown, ""},
		{"context", fmt.Errorf("wait: %w", context.DeadlineExceeded), codes.DeadlineExceeded, "wait: context deadline exceeded", context.DeadlineExceeded, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wire := ToGRPC(tc.err)
			st, ok := status.FromError(wire)
			if !ok || st.Code() != tc.code || len(st.Details()) != 0 {
				t.Fatalf("status %v (details %v), want code %v and no details", st, st.Details(), tc.code)
			}
			got := errgrpc.ToNative(wire)
			if !errors.Is(got, tc.wantIs) || got.Error() != tc.want {
				t.Fatalf("client reads %q (is %v: %v), want %q", got, tc.wantIs, errors.Is(got, tc.wantIs), tc.want)
			}
			if tc.notTwice != "" && strings.Count(got.Error(), tc.notTwice) != 1 {
				t.Fatalf("client reads %q: %q not exactly once", got, tc.notTwice)
			}
		})
	}
	if ToGRPC(nil) != nil {
		t.Fatal("ToGRPC(nil) is not nil")
	}
}

// TestRefusal: on a Create, nothing reaches the wire as Unimplemented,
// however it is classed (an errdefs class, a status from the guest agent
// passed up wrapped); every other class and nil pass as ToGRPC sends them.
func TestRefusal(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		code codes.Code
		want string
	}{
		{"errdefs class", fmt.Errorf("mount type %q: %w", "nfs", errdefs.ErrNotImplemented), codes.FailedPrecondition, `mount type "nfs": not implemented`},
		{"wrapped status", fmt.Errorf("init rootfs: %w", status.Error(codes.Unimplemented, "type nfs")), codes.FailedPrecondition, "init rootfs: rpc error: code = Unimplemented desc = type nfs"},
		{"other class", fmt.Errorf("spec: %w", errdefs.ErrInvalidArgument), codes.InvalidArgument, "spec: invalid argument"},
		{"unclassified", errors.New("boom"), codes.Unknown, "boom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, ok := status.FromError(Refusal(tc.err))
			if !ok || st.Code() != tc.code || st.Message() != tc.want {
				t.Fatalf("Refusal sends %v, want code %v and message %q", st, tc.code, tc.want)
			}
		})
	}
	if Refusal(nil) != nil {
		t.Fatal("Refusal(nil) is not nil")
	}
}
