package task

import (
	"fmt"
	"maps"
	"slices"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// hostNamespaces are the namespaces CRI leaves out of a pod's specs when
// the pod asks for the host's, each with the pod field that asks.
var hostNamespaces = []struct {
	ns    specs.LinuxNamespaceType
	field string
}{
	{specs.NetworkNamespace, "hostNetwork"},
	{specs.IPCNamespace, "hostIPC"},
	{specs.PIDNamespace, "hostPID"},
}

// refuseHostNamespaces fails a CRI pod's sandbox or container whose spec
// asks for a namespace of the host's. Its processes run in a VM, whose
// kernel is not the host's: they cannot join the host's network, IPC or
// PID namespace, and the VM's own would only pass for it. Outside CRI a
// spec without a network namespace is a VM without network (ctr run
// --net-host), as before.
func refuseHostNamespaces(id string, spec *specs.Spec) error {
	if spec.Annotations[containerTypeAnnotation] == "" || spec.Linux == nil {
		return nil
	}
	for _, h := range hostNamespaces {
		if !slices.ContainsFunc(spec.Linux.Namespaces, func(ns specs.LinuxNamespace) bool { return ns.Type == h.ns }) {
			return HostNamespaceError(id, h.field)
		}
	}
	return nil
}

// HostNamespaceError is the error of a pod that asks, with field (its
// spec's hostNetwork, hostIPC or hostPID), for a namespace of the host's.
func HostNamespaceError(id, field string) error {
	return fmt.Errorf("%s: the pod asks for a namespace of the host's (%s: true), which a VM runtime cannot give: its containers run in the pod's VM, under the VM's own kernel; run the pod without %s, or with a runtime class of runc: %w",
		id, field, field, errdefs.ErrInvalidArgument)
}

// guestSysctls are the sysctls a task's VM sets in its guest, whose
// namespaces are its pod's: the spec's, over its pod's when the pod's
// sandbox is a task of this shim (CRI puts a pod's sysctls on its
// sandbox's spec alone). A container joining its pod's VM sets none: the
// VM has its pod's.
func (s *Service) guestSysctls(spec *specs.Spec) map[string]string {
	out := map[string]string{}
	if id := spec.Annotations[sandboxIDAnnotation]; id != "" && !IsPodSandbox(spec) {
		s.mu.Lock()
		if sandbox, ok := s.tasks[id]; ok {
			maps.Copy(out, sandbox.sysctls)
		}
		s.mu.Unlock()
	}
	maps.Copy(out, sysctlsOf(spec))
	return out
}

func sysctlsOf(spec *specs.Spec) map[string]string {
	if spec.Linux == nil {
		return nil
	}
	return spec.Linux.Sysctl
}
