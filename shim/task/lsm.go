package task

import (
	"fmt"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// containerdAppArmor is the profile containerd's CRI gives a container
// that asks for the runtime's default (RuntimeDefault, or nothing) on a
// host with AppArmor.
const containerdAppArmor = "cri-containerd.apparmor.d"

// guestLSM fits the spec's security labels to the guest, whose kernel has
// no LSM: containerd's default AppArmor profile stands for the runtime's
// default confinement, which here is the VM (its seccomp, capabilities and
// namespaces still apply in the guest), so it is dropped; any other
// profile, or an SELinux label, would not hold, so it is refused, named.
func guestLSM(id string, spec *specs.Spec) error {
	if p := spec.Process; p != nil {
		switch p.ApparmorProfile {
		case "":
		case containerdAppArmor:
			p.ApparmorProfile = ""
		default:
			return lsmError(id, "AppArmor profile "+p.ApparmorProfile, "drop the profile (or ask for RuntimeDefault)")
		}
		if p.SelinuxLabel != "" {
			return lsmError(id, "SELinux label "+p.SelinuxLabel, "run containerd's CRI without enable_selinux for this runtime class")
		}
	}
	if spec.Linux != nil && spec.Linux.MountLabel != "" {
		return lsmError(id, "SELinux mount label "+spec.Linux.MountLabel, "run containerd's CRI without enable_selinux for this runtime class")
	}
	return nil
}

func lsmError(id, what, fix string) error {
	return fmt.Errorf("%s: the spec asks for %s, which cannot hold: its processes run under the VM's kernel, which has no LSM (the VM is their boundary); %s, or use a runtime class of runc: %w",
		id, what, fix, errdefs.ErrInvalidArgument)
}
