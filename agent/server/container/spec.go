package container

import (
	"encoding/json"
	"fmt"
	"os"
	"path"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// MaxSpecSize bounds a container's spec, an exec's process and resources.
const MaxSpecSize = api.MaxContainerSpec

// guestSpec reads the host's spec for the guest: its cgroup is under
// parent, and its network is the VM's, which every container of the pod
// shares. Everything else stays for runc; the root's path is set once the
// root is there.
func guestSpec(id string, data []byte, parent string) (*specs.Spec, error) {
	if len(data) > MaxSpecSize {
		return nil, fmt.Errorf("spec of %q is %d bytes, expected at most %d: %w", id, len(data), MaxSpecSize, errdefs.ErrInvalidArgument)
	}
	var s specs.Spec
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("spec of %q: expected OCI runtime-spec JSON: %v: %w", id, err, errdefs.ErrInvalidArgument)
	}
	if s.Process == nil || s.Linux == nil {
		return nil, fmt.Errorf("spec of %q: expected a process and a linux section: %w", id, errdefs.ErrInvalidArgument)
	}
	if err := checkPIDNamespace(s.Linux.Namespaces); err != nil {
		return nil, fmt.Errorf("spec of %q: %w", id, err)
	}
	ns, err := withoutNetwork(s.Linux.Namespaces)
	if err != nil {
		return nil, fmt.Errorf("spec of %q: %w", id, err)
	}
	s.Linux.Namespaces = ns
	if s.Root == nil {
		s.Root = &specs.Root{}
	}
	s.Linux.CgroupsPath = path.Join(parent, id)
	return &s, nil
}

// checkPIDNamespace wants a PID namespace of the container's own, or a
// path to its pod's (another container's in the guest): without one the
// container would see the agent and its peers, and its orphans would be
// the agent's to reap.
func checkPIDNamespace(in []specs.LinuxNamespace) error {
	for _, ns := range in {
		if ns.Type == specs.PIDNamespace {
			return nil
		}
	}
	return fmt.Errorf("no PID namespace: a container in a cocoon VM needs a PID namespace of its own or its pod's: %w", errdefs.ErrInvalidArgument)
}

// checkRootfs wants an absolute path to a directory.
func checkRootfs(rootfs string) error {
	if !path.IsAbs(rootfs) {
		return fmt.Errorf("rootfs %q: expected an absolute path in the guest: %w", rootfs, errdefs.ErrInvalidArgument)
	}
	fi, err := os.Stat(rootfs)
	if err != nil {
		return fmt.Errorf("rootfs: %w: %w", err, errdefs.ErrFailedPrecondition)
	}
	if !fi.IsDir() {
		return fmt.Errorf("rootfs %q is not a directory: %w", rootfs, errdefs.ErrInvalidArgument)
	}
	return nil
}

// withoutNetwork drops the request for a network namespace of the
// container's own: the VM's network is the pod's. A path to join is
// refused: no namespace of the host exists in the guest.
func withoutNetwork(in []specs.LinuxNamespace) ([]specs.LinuxNamespace, error) {
	out := make([]specs.LinuxNamespace, 0, len(in))
	for _, ns := range in {
		if ns.Type != specs.NetworkNamespace {
			out = append(out, ns)
			continue
		}
		if ns.Path != "" {
			return nil, fmt.Errorf("network namespace %q: a container in the VM shares the VM's network, expected none with a path: %w", ns.Path, errdefs.ErrInvalidArgument)
		}
	}
	return out, nil
}

// processSpec reads an exec's OCI process.
func processSpec(id string, data []byte) (*specs.Process, error) {
	if len(data) > MaxSpecSize {
		return nil, fmt.Errorf("process %q is %d bytes, expected at most %d: %w", id, len(data), MaxSpecSize, errdefs.ErrInvalidArgument)
	}
	var p specs.Process
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, fmt.Errorf("process %q: expected an OCI process as JSON: %v: %w", id, err, errdefs.ErrInvalidArgument)
	}
	if len(p.Args) == 0 {
		return nil, fmt.Errorf("process %q: expected args: %w", id, errdefs.ErrInvalidArgument)
	}
	return &p, nil
}
