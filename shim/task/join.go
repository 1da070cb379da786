package task

import (
	"context"
	"errors"
	"fmt"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
)

// PodMember is what the task record of a container that joined its pod's
// VM names as its hypervisor: the VM is the sandbox task's, so `shim
// delete` of the container kills nothing (its record has no pid).
const PodMember = "none (joined its pod's VM)"

// podHost is the VM spec's container joins: its pod's, when this shim
// serves the pod's VM, as a pod VM of the sandbox API (StartPod) or as the
// sandbox task's VM that takes the pod's containers (shim.pod_vm = "pod").
func (s *Service) podHost(spec *specs.Spec) Host {
	if spec == nil || IsPodSandbox(spec) {
		return nil
	}
	id := spec.Annotations[sandboxIDAnnotation]
	if id == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, ok := s.pods[id]; ok {
		return p.sb.Host
	}
	if sb, ok := s.tasks[id]; ok && sb.sb.Host != nil {
		return sb.sb.Host
	}
	return nil
}

// join creates the task's container in its pod's running VM. Its record,
// written first, names no process: the VM, and the container in it, end
// with the sandbox's task. The report's phases are the bundle's, the
// join's and the record's.
func (s *Service) join(ctx context.Context, host Host, req LaunchRequest, init *process, began time.Time) (*task, error) {
	phases := []state.Phase{{Name: PhaseBundle, Duration: config.Duration(time.Since(began))}}
	rec := &state.Task{ID: req.ID, Hypervisor: PodMember, StagedDir: req.StagedDir,
		Plan: state.Plan{Mode: "join", Reasons: []string{"a container of a pod whose VM runs: joined it"}}}
	if err := state.WriteTask(req.Bundle, rec); err != nil {
		return nil, err
	}
	sb, err := host.Join(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("join the pod's VM: %w", err)
	}
	recording := time.Now()
	rec.Plan = sb.Plan
	if err := state.WriteTask(req.Bundle, rec); err != nil {
		return nil, errors.Join(err, sb.VM.Kill(), sb.VM.Close())
	}
	phases = append(append(phases, sb.Phases...), state.Phase{Name: PhaseRecord, Duration: config.Duration(time.Since(recording))})
	t := newTask(ctx, req.ID, req.Bundle, sb, rec, init, s.send)
	t.created, t.namespace, t.phases, t.host = began, req.Namespace, phases, host
	t.reports.Go(func() { t.saveReport(context.WithoutCancel(ctx)) })
	return t, nil
}
