package launch

import (
	"testing"

	bootapi "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	"github.com/containerd/containerd/v2/pkg/protobuf/proto"
	"github.com/containerd/typeurl/v2"
	"google.golang.org/protobuf/types/known/emptypb"
)

func TestDecodeParams(t *testing.T) {
	dir := "/run/containerd/s"
	ext, err := typeurl.MarshalAnyToProto(&emptypb.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		in   *bootapi.BootstrapParams
		want Params
	}{
		{"all fields", &bootapi.BootstrapParams{
			InstanceID: "t1", Namespace: "ns", LogLevel: bootapi.LogLevel_LOG_LEVEL_DEBUG,
			ContainerdVersion: "v2.4.2", ContainerdTtrpcAddress: "/c.sock.ttrpc", ContainerdGrpcAddress: "/c.sock",
			ContainerdBinary: "/bin/containerd", Extensions: []*bootapi.Extension{{Value: ext}}, SocketDir: &dir,
		}, Params{InstanceID: "t1", Namespace: "ns", LogLevel: -4, ContainerdGRPC: "/c.sock", SocketDir: dir}},
		{"info level, no socket dir", &bootapi.BootstrapParams{InstanceID: "t1", Namespace: "ns", ContainerdGrpcAddress: "/c.sock"},
			Params{InstanceID: "t1", Namespace: "ns", ContainerdGRPC: "/c.sock"}},
		{"trace level", &bootapi.BootstrapParams{InstanceID: "t1", Namespace: "ns", LogLevel: bootapi.LogLevel_LOG_LEVEL_TRACE},
			Params{InstanceID: "t1", Namespace: "ns", LogLevel: -8}},
		{"error level", &bootapi.BootstrapParams{InstanceID: "t1", Namespace: "ns", LogLevel: bootapi.LogLevel_LOG_LEVEL_ERROR},
			Params{InstanceID: "t1", Namespace: "ns", LogLevel: 8}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data, err := proto.Marshal(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeParams(data)
			if err != nil || got != tt.want {
				t.Fatalf("DecodeParams = %+v, %v; want %+v", got, err, tt.want)
			}
			if wantDebug := tt.in.LogLevel <= bootapi.LogLevel_LOG_LEVEL_DEBUG; got.Debug() != wantDebug {
				t.Fatalf("Debug() = %v, want %v", got.Debug(), wantDebug)
			}
		})
	}
}

func TestDecodeParamsRefuses(t *testing.T) {
	noID, err := proto.Marshal(&bootapi.BootstrapParams{Namespace: "ns"})
	if err != nil {
		t.Fatal(err)
	}
	for name, in := range map[string][]byte{
		"empty":         nil,
		"no instance":   noID,
		"truncated":     {0x0a, 0x05, 't'},
		"bad tag":       {0xff},
		"wrong id type": {0x08, 0x01},
	} {
		if p, err := DecodeParams(in); err == nil {
			t.Errorf("%s: DecodeParams = %+v, want an error", name, p)
		}
	}
}

func TestEncodeResult(t *testing.T) {
	var got bootapi.BootstrapResult
	if err := proto.Unmarshal(EncodeResult("unix:///run/s/abc"), &got); err != nil {
		t.Fatal(err)
	}
	if got.Version != 3 || got.Address != "unix:///run/s/abc" || got.Protocol != "ttrpc" {
		t.Fatalf("result = %+v, want version 3 ttrpc at unix:///run/s/abc", &got)
	}
}
