package task

import (
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestGuestLSM: containerd's default AppArmor profile is dropped (the VM
// is the runtime's default confinement); another profile, an SELinux label
// or mount label is refused, naming it.
func TestGuestLSM(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec specs.Spec
		want string // in the error; "" for none
	}{
		{"none", specs.Spec{Process: &specs.Process{}}, ""},
		{"containerd's default", specs.Spec{Process: &specs.Process{ApparmorProfile: containerdAppArmor}}, ""},
		{"localhost profile", specs.Spec{Process: &specs.Process{ApparmorProfile: "k8s-deny-write"}}, "AppArmor profile k8s-deny-write"},
		{"selinux label", specs.Spec{Process: &specs.Process{SelinuxLabel: "system_u:system_r:container_t:s0"}}, "SELinux label system_u:system_r:container_t:s0"},
		{"selinux mount label", specs.Spec{Linux: &specs.Linux{MountLabel: "system_u:object_r:container_file_t:s0"}}, "SELinux mount label"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := guestLSM("c1", &tc.spec)
			if tc.want == "" {
				if err != nil || (tc.spec.Process != nil && tc.spec.Process.ApparmorProfile != "") {
					t.Fatalf("guestLSM: %v, profile left %q: want none and no profile", err, tc.spec.Process.ApparmorProfile)
				}
				return
			}
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "c1: ") {
				t.Fatalf("guestLSM: %v, want invalid argument naming c1 and %q", err, tc.want)
			}
		})
	}
}
