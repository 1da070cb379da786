package task

import (
	"maps"
	"slices"
	"strings"
	"testing"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// criSpec is a CRI spec of the given container type (sandbox or
// container) in pod "pod1", with the pod's namespaces but those left out.
func criSpec(kind string, without ...specs.LinuxNamespaceType) *specs.Spec {
	s := specFor("sleep", "1")
	s.Annotations = map[string]string{containerTypeAnnotation: kind, sandboxIDAnnotation: "pod1"}
	s.Linux = &specs.Linux{}
	for _, t := range []specs.LinuxNamespaceType{specs.NetworkNamespace, specs.IPCNamespace, specs.PIDNamespace, specs.MountNamespace} {
		if !slices.Contains(without, t) {
			s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: t})
		}
	}
	return s
}

// TestRefuseHostNamespaces: a CRI pod's sandbox or container that asks for
// the host's network, IPC or PID namespace fails its create at once, naming
// the pod field; outside CRI a spec without a network namespace is a VM
// without network, as before.
func TestRefuseHostNamespaces(t *testing.T) {
	noNet := specFor("sleep", "1")
	noNet.Linux = &specs.Linux{}
	for _, tc := range []struct {
		name string
		spec *specs.Spec
		want string // the field named, "" for no error
	}{
		{"pod's namespaces", criSpec("container"), ""},
		{"hostNetwork sandbox", criSpec("sandbox", specs.NetworkNamespace), "hostNetwork"},
		{"hostNetwork container", criSpec("container", specs.NetworkNamespace), "hostNetwork"},
		{"hostIPC", criSpec("container", specs.IPCNamespace), "hostIPC"},
		{"hostPID", criSpec("sandbox", specs.PIDNamespace), "hostPID"},
		{"ctr run --net-host", noNet, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			_, err := h.svc.Create(h.ctx, &taskAPI.CreateTaskRequest{ID: "c1", Bundle: h.bundle(tc.spec), Rootfs: h.rootfs()})
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Create: %v", err)
				}
				return
			}
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "("+tc.want+": true)") {
				t.Fatalf("Create: %v, want invalid argument naming %s", err, tc.want)
			}
			if len(h.launcher.got) != 0 {
				t.Fatalf("a refused create launched %d VMs", len(h.launcher.got))
			}
		})
	}
}

// TestGuestSysctls: a container's VM sets its pod's sysctls, which CRI
// puts on the sandbox's spec alone, with its own spec's over them.
func TestGuestSysctls(t *testing.T) {
	h := newHarness(t)
	pod := criSpec("sandbox")
	pod.Linux.Sysctl = map[string]string{"kernel.shm_rmid_forced": "1", "net.ipv4.ip_unprivileged_port_start": "0"}
	h.create("pod1", pod, nil)
	ctr := criSpec("container")
	ctr.Linux.Sysctl = map[string]string{"net.ipv4.ip_unprivileged_port_start": "80"}
	h.create("c1", ctr, nil)
	want := []map[string]string{pod.Linux.Sysctl, {"kernel.shm_rmid_forced": "1", "net.ipv4.ip_unprivileged_port_start": "80"}}
	for i, r := range h.launcher.got {
		if !maps.Equal(r.Sysctls, want[i]) {
			t.Errorf("launch of %s: sysctls %v, want %v", r.ID, r.Sysctls, want[i])
		}
	}
}
