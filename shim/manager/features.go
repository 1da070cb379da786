package manager

import (
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/opencontainers/runtime-spec/specs-go/features"
)

// mountOptions are the OCI mount options a task's mounts may carry: those
// the guest mounts with (its agent's, and its runc's for a pod's
// containers), and rro, which a bind's copy honours as ro (a copy has no
// mounts under it). Reporting rro lets containerd's CRI take recursive
// read-only mounts for this runtime.
var mountOptions = []string{
	"async", "atime", "bind", "dev", "diratime", "dirsync", "exec", "noatime", "nodev",
	"nodiratime", "noexec", "norelatime", "nostrictatime", "nosuid", "nosymfollow",
	"private", "rbind", "relatime", "ro", "rprivate", "rro", "rshared", "rslave",
	"runbindable", "rw", "shared", "slave", "strictatime", "suid", "symfollow", "sync", "unbindable",
}

// runtimeFeatures is what the runtime supports, as runc's `features`
// reports its own (OCI runtime features).
func runtimeFeatures() *features.Features {
	return &features.Features{
		OCIVersionMin: "1.0.0",
		OCIVersionMax: specs.Version,
		Hooks:         []string{"prestart", "createRuntime", "createContainer", "poststart", "poststop"},
		MountOptions:  mountOptions,
	}
}
