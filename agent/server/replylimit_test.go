package server

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

func TestBoundReply(t *testing.T) {
	for _, tc := range []struct {
		name string
		resp any
		want error
	}{
		{"empty", &emptypb.Empty{}, nil},
		// A field tag and a 4-byte length.
		{"at the bound", &api.ReadOutputResponse{Data: make([]byte, maxReply-5)}, nil},
		{"over the bound", &api.ReadOutputResponse{Data: make([]byte, maxReply)}, errdefs.ErrResourceExhausted},
		{"not a message", "reply", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := boundReply("/test", tc.resp); !errors.Is(err, tc.want) || (err == nil) != (tc.want == nil) {
				t.Errorf("boundReply = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestSendableError(t *testing.T) {
	plain := status.Error(codes.NotFound, "process \"x\": not found")
	long := strings.Repeat("a", maxErrorLen-1) + "é" + strings.Repeat("b", 100)
	for _, tc := range []struct {
		name string
		err  error
		want string // "" when err must pass unchanged
	}{
		{"plain", plain, ""},
		{"not a status", errors.New("plain"), ""},
		{"invalid UTF-8", status.Error(codes.Unknown, "exec \"\xff\": not found"), "exec \"\uFFFD\": not found"},
		{"long", status.Error(codes.InvalidArgument, long), strings.Repeat("a", maxErrorLen-1) + "... (102 bytes cut)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := sendableError(tc.err)
			if tc.want == "" {
				if got != tc.err {
					t.Errorf("sendableError(%v) = %v, want it unchanged", tc.err, got)
				}
				return
			}
			in, _ := status.FromError(tc.err)
			st, _ := status.FromError(got)
			if st.Code() != in.Code() || st.Message() != tc.want {
				t.Errorf("sendableError = %v %.60q, want %v %.60q", st.Code(), st.Message(), in.Code(), tc.want)
			}
			if !utf8.ValidString(st.Message()) {
				t.Error("message is not valid UTF-8")
			}
			if _, err := proto.Marshal(st.Proto()); err != nil {
				t.Errorf("marshal the status: %v", err)
			}
		})
	}
}
