package sandboxapi

import (
	"encoding/json"
	"fmt"
	"slices"

	sandboxAPI "github.com/containerd/containerd/api/runtime/sandbox/v1"
	"github.com/containerd/errdefs"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// containerd's CRI puts a pod's in-place resize (UpdatePodSandboxResources)
// in the sandbox's extensions under this key, as its podsandbox package's
// UpdatedResources type: typeurl encodes a type that is not protobuf as
// JSON under its registered name.
const (
	resizeExtension = "updated-resources"
	resizeTypeURL   = "io.containerd.cri.v1/UpdatedResources"
)

// updatedResources is containerd's podsandbox.UpdatedResources, which the
// shim cannot import (it is internal to containerd).
type updatedResources struct {
	Overhead  *runtime.LinuxContainerResources
	Resources *runtime.LinuxContainerResources
}

// resizeOf reads the pod-level resources an UpdateSandbox carries; nil
// when it carries none (another field changed, or no resize yet).
func resizeOf(r *sandboxAPI.UpdateSandboxRequest) (*runtime.LinuxContainerResources, error) {
	if len(r.Fields) > 0 && !slices.Contains(r.Fields, "extensions") {
		return nil, nil
	}
	ext, ok := r.GetSandbox().GetExtensions()[resizeExtension]
	if !ok {
		return nil, nil
	}
	if ext.GetTypeUrl() != resizeTypeURL {
		return nil, fmt.Errorf("extension %q of sandbox %s is a %s, want %s: %w", resizeExtension, r.SandboxID, ext.GetTypeUrl(), resizeTypeURL, errdefs.ErrInvalidArgument)
	}
	var u updatedResources
	if err := json.Unmarshal(ext.GetValue(), &u); err != nil {
		return nil, fmt.Errorf("decode extension %q of sandbox %s: %w: %w", resizeExtension, r.SandboxID, err, errdefs.ErrInvalidArgument)
	}
	return u.Resources, nil
}

// resize puts the pod's new limits on its running VM. The overhead is the
// node's (kubelet adds it to the pod's cgroup, above the VM's) and the
// spec keeps the limits the VM started with, as containerd's own sandbox
// keeps its sandbox container's.
func (sb *sandbox) resize(res *runtime.LinuxContainerResources) error {
	p, err := sb.running()
	if err != nil {
		return err
	}
	return p.Update(podResources(res))
}
