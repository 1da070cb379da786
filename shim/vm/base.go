package vm

import (
	"strconv"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/baseimage"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
)

// sandboxMemoryAnnotation is the pod's memory limit, which containerd's
// CRI puts on the pod's sandbox spec (its sandbox sizing annotations).
const sandboxMemoryAnnotation = "io.kubernetes.cri.sandbox-memory"

// fitOf is the fit r's VM needs.
func fitOf(r task.LaunchRequest) baseimage.Fit {
	f := baseimage.Fit{Pod: r.Bare || task.IsPodSandbox(r.Spec)}
	if res := resourcesOf(r.Spec); res != nil && res.Memory != nil && res.Memory.Limit != nil && *res.Memory.Limit > 0 {
		f.Limit = *res.Memory.Limit
	}
	if f.Pod && r.Spec != nil {
		if n, err := strconv.ParseInt(r.Spec.Annotations[sandboxMemoryAnnotation], 10, 64); err == nil && n > 0 {
			f.Limit = n
		}
	}
	return f
}
