package container

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

func TestGuestSpec(t *testing.T) {
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
	pid := specs.LinuxNamespace{Type: specs.PIDNamespace}
	mnt := specs.LinuxNamespace{Type: specs.MountNamespace}
	podPID := specs.LinuxNamespace{Type: specs.PIDNamespace, Path: "/proc/42/ns/pid"}
	for _, tc := range []struct {
		name    string
		data    []byte
		wantNS  []specs.LinuxNamespace
		wantErr func(error) bool
		errHas  string
	}{
		{name: "ok", data: spec(pid, specs.LinuxNamespace{Type: specs.NetworkNamespace}, mnt), wantNS: []specs.LinuxNamespace{pid, mnt}},
		{name: "pod-pid", data: spec(podPID, mnt), wantNS: []specs.LinuxNamespace{podPID, mnt}},
		{name: "no-pid", data: spec(mnt), wantErr: errdefs.IsInvalidArgument, errHas: "a container in a cocoon VM needs a PID namespace of its own or its pod's"},
		{name: "no-namespaces", data: spec(), wantErr: errdefs.IsInvalidArgument, errHas: "PID namespace"},
		{name: "netns-path", data: spec(pid, specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: "/var/run/netns/x"}), wantErr: errdefs.IsInvalidArgument, errHas: "/var/run/netns/x"},
		{name: "too-large", data: make([]byte, MaxSpecSize+1), wantErr: errdefs.IsInvalidArgument, errHas: "expected at most"},
		{name: "not-json", data: []byte("{"), wantErr: errdefs.IsInvalidArgument, errHas: "runtime-spec JSON"},
		{name: "no-process", data: []byte(`{"linux":{}}`), wantErr: errdefs.IsInvalidArgument, errHas: "process"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := guestSpec("c1", tc.data, "/cocoon")
			if tc.wantErr != nil {
				if !tc.wantErr(err) || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("error %v, want one naming %q of the right class", err, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !s.Root.Readonly || s.Linux.CgroupsPath != "/cocoon/c1" {
				t.Errorf("root %+v, cgroups path %q", s.Root, s.Linux.CgroupsPath)
			}
			if !slices.Equal(s.Linux.Namespaces, tc.wantNS) {
				t.Errorf("namespaces %+v, want %+v", s.Linux.Namespaces, tc.wantNS)
			}
		})
	}
}

// TestCheckRoot: a container's root is a directory or a disk, exactly one.
func TestCheckRoot(t *testing.T) {
	rootfs := t.TempDir()
	file := rootfs + "/file"
	if err := writeEmpty(file); err != nil {
		t.Fatal(err)
	}
	disk := &api.Rootfs{Fstype: "erofs", Serial: "cocoon-disk-0"}
	for _, tc := range []struct {
		name    string
		o       CreateOptions
		wantErr func(error) bool
		errHas  string
	}{
		{name: "dir", o: CreateOptions{Rootfs: rootfs}},
		{name: "disk", o: CreateOptions{RootDisk: disk}},
		{name: "both", o: CreateOptions{Rootfs: rootfs, RootDisk: disk}, wantErr: errdefs.IsInvalidArgument, errHas: "expected one of them"},
		{name: "neither", o: CreateOptions{}, wantErr: errdefs.IsInvalidArgument, errHas: "expected a rootfs directory or a root disk"},
		{name: "disk-mounts", o: CreateOptions{RootDisk: &api.Rootfs{Fstype: "erofs", Serial: "s", Mounts: []*api.Mount{{Destination: "/proc"}}}}, wantErr: errdefs.IsInvalidArgument, errHas: "expected none"},
		{name: "relative-rootfs", o: CreateOptions{Rootfs: "rootfs"}, wantErr: errdefs.IsInvalidArgument, errHas: "absolute"},
		{name: "missing-rootfs", o: CreateOptions{Rootfs: rootfs + "/none"}, wantErr: errdefs.IsFailedPrecondition, errHas: "none"},
		{name: "file-rootfs", o: CreateOptions{Rootfs: file}, wantErr: errdefs.IsInvalidArgument, errHas: "not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkRoot(tc.o)
			if tc.wantErr == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !tc.wantErr(err) || !strings.Contains(err.Error(), tc.errHas) {
				t.Fatalf("error %v, want one naming %q of the right class", err, tc.errHas)
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
