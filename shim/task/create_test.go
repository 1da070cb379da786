package task

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/api/types/runc/options"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

func TestRootfsOf(t *testing.T) {
	staged := t.TempDir()
	img := filepath.Join(staged, chain.StagedRootfsImage)
	if err := os.WriteFile(img, make([]byte, 8192), 0o444); err != nil {
		t.Fatal(err)
	}
	if err := chain.WriteStagedRootfs(staged, chain.StagedRootfs{FSType: chain.RootfsErofs, Size: 8192, Key: "k", Layers: 1}); err != nil {
		t.Fatal(err)
	}
	overlay := func(dir string) []*types.Mount {
		return []*types.Mount{{Type: "overlay", Source: "overlay", Options: []string{
			"index=off", "workdir=" + filepath.Join(dir, "work"), "upperdir=" + filepath.Join(dir, "fs"), "lowerdir=/l1:/l2"}}}
	}
	tests := []struct {
		name      string
		mounts    []*types.Mount
		want      string
		wantImage string
		wantErr   bool
	}{
		{"no mounts: client mounted rootfs", nil, "/b/rootfs", "", false},
		{"bind type", []*types.Mount{{Type: "bind", Source: "/staged/1"}}, "/staged/1", "", false},
		{"rbind option", []*types.Mount{{Type: "none", Source: "/staged/2", Options: []string{"rbind", "ro"}}}, "/staged/2", "", false},
		{"overlay with a staged image", overlay(staged), "", img, false},
		{"overlay without one", overlay(t.TempDir()), "", "", true},
		{"overlay without upperdir", []*types.Mount{{Type: "overlay", Source: "overlay", Options: []string{"lowerdir=/a:/b"}}}, "", "", true},
		{"two binds", []*types.Mount{{Type: "bind", Source: "/a"}, {Type: "bind", Source: "/b"}}, "", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, image, err := rootfsOf(tt.mounts, "/b")
			var gotImage string
			if image != nil {
				gotImage = image.ImagePath()
			}
			if (err != nil) != tt.wantErr || got != tt.want || gotImage != tt.wantImage {
				t.Fatalf("rootfsOf = %q, %q, %v; want %q, %q, error %v", got, gotImage, err, tt.want, tt.wantImage, tt.wantErr)
			}
			if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("error %v is not an invalid argument", err)
			}
		})
	}
}

func TestConfigOf(t *testing.T) {
	anyOf := func(m any) *taskAPI.CreateTaskRequest {
		a, err := typeurl.MarshalAnyToProto(m)
		if err != nil {
			t.Fatal(err)
		}
		return &taskAPI.CreateTaskRequest{Options: a}
	}
	tests := []struct {
		name     string
		req      *taskAPI.CreateTaskRequest
		wantPath string
		wantBody string
		wantErr  bool
	}{
		{"none", &taskAPI.CreateTaskRequest{}, "", "", false},
		{"config path", anyOf(&runtimeoptions.Options{ConfigPath: "/etc/c.toml"}), "/etc/c.toml", "", false},
		{"inline body (a CRI handler's options table)", anyOf(&runtimeoptions.Options{ConfigBody: []byte("[restore]\nmode = \"copy\"\n")}), "", "[restore]\nmode = \"copy\"\n", false},
		{"both", anyOf(&runtimeoptions.Options{ConfigPath: "/etc/c.toml", ConfigBody: []byte("x = 1")}), "", "", true},
		{"runc options", anyOf(&options.Options{BinaryName: "runc"}), "", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path, body, err := configOf(tt.req)
			if (err != nil) != tt.wantErr || path != tt.wantPath || body != tt.wantBody {
				t.Fatalf("configOf = %q, %q, %v; want %q, %q, error %v", path, body, err, tt.wantPath, tt.wantBody, tt.wantErr)
			}
		})
	}
}

func TestGuestProcess(t *testing.T) {
	p := &specs.Process{
		Args: []string{"sh", "-c", "id"},
		Env:  []string{"A=1"},
		User: specs.User{UID: 1000, GID: 100, AdditionalGids: []uint32{10, 20}},
	}
	profile := &specs.LinuxSeccomp{DefaultAction: specs.ActErrno}
	got, err := guestProcess("init", p, profile, true, true)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != "init" || !slices.Equal(got.Args, p.Args) || got.Cwd != "/" || got.UID != 1000 || got.GID != 100 ||
		!slices.Equal(got.AdditionalGIDs, []uint32{10, 20}) || !got.Terminal || !got.Stdin || got.Seccomp != profile {
		t.Fatalf("guest process %+v does not carry the OCI process", got)
	}
	if _, err := guestProcess("init", &specs.Process{}, nil, false, false); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("process without args: %v, want invalid argument", err)
	}
}

// TestInitProcessPIDNamespace: a pod's sandbox asking for a PID namespace
// of its own gets one in the guest (its pause holds the pod's); a pod
// sharing the host's, or an app container, does not.
func TestInitProcessPIDNamespace(t *testing.T) {
	sandbox := map[string]string{containerTypeAnnotation: containerTypeSandbox}
	for _, tc := range []struct {
		name        string
		annotations map[string]string
		namespaces  []specs.LinuxNamespace
		want        bool
	}{
		{"pod sandbox", sandbox, []specs.LinuxNamespace{{Type: specs.NetworkNamespace}, {Type: specs.PIDNamespace}}, true},
		{"pod sandbox sharing the host's", sandbox, []specs.LinuxNamespace{{Type: specs.NetworkNamespace}}, false},
		{"app container", nil, []specs.LinuxNamespace{{Type: specs.PIDNamespace}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := &specs.Spec{Annotations: tc.annotations, Process: &specs.Process{Args: []string{"/pause"}},
				Linux: &specs.Linux{Namespaces: tc.namespaces}}
			p, err := initProcess(spec, &taskAPI.CreateTaskRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if p.spec.OwnPIDNamespace != tc.want {
				t.Fatalf("own PID namespace %v, want %v", p.spec.OwnPIDNamespace, tc.want)
			}
		})
	}
}

func TestHostnameOf(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pod := write("hostname", "web-0\n")
	empty := write("empty", "")
	long := write("long", strings.Repeat("x", 65))
	link := filepath.Join(dir, "link")
	if err := os.Symlink(pod, link); err != nil {
		t.Fatal(err)
	}
	mountAt := func(src string) []specs.Mount {
		return []specs.Mount{{Destination: "/etc/hosts", Source: long}, {Destination: "/etc/hostname", Type: "bind", Source: src}}
	}
	for _, c := range []struct {
		name    string
		spec    specs.Spec
		want    string
		wantErr bool
	}{
		{"spec hostname wins", specs.Spec{Hostname: "h", Mounts: mountAt(pod)}, "h", false},
		{"mounted /etc/hostname", specs.Spec{Mounts: mountAt(pod)}, "web-0", false},
		{"empty file falls back to the id", specs.Spec{Mounts: mountAt(empty)}, "ctr-1", false},
		{"no mount: the id", specs.Spec{}, "ctr-1", false},
		{"too long", specs.Spec{Mounts: mountAt(long)}, "", true},
		{"symlink refused", specs.Spec{Mounts: mountAt(link)}, "", true},
		{"missing file", specs.Spec{Mounts: mountAt(filepath.Join(dir, "nope"))}, "", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := hostnameOf(&c.spec, "ctr-1")
			if (err != nil) != c.wantErr || got != c.want {
				t.Fatalf("hostnameOf = %q, %v; want %q, error %v", got, err, c.want, c.wantErr)
			}
		})
	}
}
