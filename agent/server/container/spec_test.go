package container

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestGuestSpec(t *testing.T) {
	rootfs := t.TempDir()
	file := rootfs + "/file"
	if err := writeEmpty(file); err != nil {
		t.Fatal(err)
	}
	spec := func(ns ...specs.LinuxNamespace) []byte {
		data, err := json.Marshal(specs.Spec{
			Process: &specs.Process{Args: []string{"true"}},
			Root:    &specs.Root{Path: "rootfs", Readonly: true},
			Linux:   &specs.Linux{Namespaces: ns, CgroupsPath: "/k8s/pod/ctr"},
		})
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	own := []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.MountNamespace}}
	for _, tc := range []struct {
		name    string
		data    []byte
		rootfs  string
		wantErr func(error) bool
		errHas  string
	}{
		{name: "ok", data: spec(own...), rootfs: rootfs},
		{name: "netns-path", data: spec(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: "/var/run/netns/x"}), rootfs: rootfs, wantErr: errdefs.IsInvalidArgument, errHas: "/var/run/netns/x"},
		{name: "too-large", data: make([]byte, MaxSpecSize+1), rootfs: rootfs, wantErr: errdefs.IsInvalidArgument, errHas: "expected at most"},
		{name: "not-json", data: []byte("{"), rootfs: rootfs, wantErr: errdefs.IsInvalidArgument, errHas: "runtime-spec JSON"},
		{name: "no-process", data: []byte(`{"linux":{}}`), rootfs: rootfs, wantErr: errdefs.IsInvalidArgument, errHas: "process"},
		{name: "relative-rootfs", data: spec(), rootfs: "rootfs", wantErr: errdefs.IsInvalidArgument, errHas: "absolute"},
		{name: "missing-rootfs", data: spec(), rootfs: rootfs + "/none", wantErr: errdefs.IsFailedPrecondition, errHas: "none"},
		{name: "file-rootfs", data: spec(), rootfs: file, wantErr: errdefs.IsInvalidArgument, errHas: "not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := guestSpec("c1", tc.data, tc.rootfs, "/cocoon")
			if tc.wantErr != nil {
				if !tc.wantErr(err) || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("error %v, want one naming %q of the right class", err, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.Root.Path != rootfs || !s.Root.Readonly || s.Linux.CgroupsPath != "/cocoon/c1" {
				t.Errorf("root %+v, cgroups path %q", s.Root, s.Linux.CgroupsPath)
			}
			want := []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.MountNamespace}}
			if len(s.Linux.Namespaces) != len(want) || s.Linux.Namespaces[0] != want[0] || s.Linux.Namespaces[1] != want[1] {
				t.Errorf("namespaces %+v, want %+v", s.Linux.Namespaces, want)
			}
		})
	}
}

func TestProcessSpec(t *testing.T) {
	for _, tc := range []struct {
		name, data, errHas string
	}{
		{name: "ok", data: `{"args":["true"],"cwd":"/"}`},
		{name: "no-args", data: `{"cwd":"/"}`, errHas: "expected args"},
		{name: "not-json", data: `[`, errHas: "OCI process"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := processSpec("e1", []byte(tc.data))
			if tc.errHas == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.errHas) {
				t.Fatalf("error %v, want InvalidArgument naming %q", err, tc.errHas)
			}
		})
	}
}

func TestResources(t *testing.T) {
	r, err := resources("c1", []byte(`{"memory":{"limit":33554432}}`))
	if err != nil || r.Memory == nil || *r.Memory.Limit != 32<<20 {
		t.Fatalf("resources %+v, %v", r, err)
	}
	if _, err := resources("c1", []byte(`{"memory":`)); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad JSON: %v, want InvalidArgument", err)
	}
}

func TestKeyedValue(t *testing.T) {
	data := []byte("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
	if n, err := keyedValue(data, "oom_kill"); err != nil || n != 3 {
		t.Errorf("oom_kill = %d, %v; want 3", n, err)
	}
	if _, err := keyedValue(data, "oom_group_kill"); err == nil {
		t.Error("a missing key read without error")
	}
}

func TestLastError(t *testing.T) {
	for line, want := range map[string]string{
		`{"level":"error","msg":"container not running","time":"t"}`: "container not running",
		`{"level":"warning","msg":"deprecated"}`:                     "",
		`not json`:                                                   "",
	} {
		if got := lastError(line); got != want {
			t.Errorf("lastError(%s) = %q, want %q", line, got, want)
		}
	}
}

func writeEmpty(path string) error {
	return os.WriteFile(path, nil, 0o644)
}
