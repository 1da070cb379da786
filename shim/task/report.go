package task

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/log"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
)

// The service's own restore phases, around the launcher's: PhaseBundle
// reads the bundle (the OCI spec, rootfs, runtime options and hooks)
// before the launch; PhaseRecord waits for what the VM's setup (its task
// record, made durable, and its cgroup) has left once the guest is up;
// startedPhase runs from the Start call to the init process running in
// the guest.
const (
	PhaseBundle  = "bundle"
	PhaseRecord  = "record"
	startedPhase = "process started"
)

// writeReport writes the restore report (plan, reasons, phase timings) into
// the bundle and logs it.
func (t *task) writeReport(ctx context.Context) error {
	t.recMu.Lock()
	defer t.recMu.Unlock()
	r := &state.Report{
		ID:         t.id,
		Hypervisor: t.rec.Hypervisor,
		StagedDir:  t.rec.StagedDir,
		Plan:       t.rec.Plan,
		Phases:     t.phases,
		CreatedAt:  t.created,
	}
	fields := log.Fields{"id": t.id, "hypervisor": r.Hypervisor, "mode": r.Plan.Mode, "reasons": r.Plan.Reasons}
	for _, p := range r.Phases {
		r.Total += p.Duration
		fields["phase."+p.Name] = time.Duration(p.Duration).String()
	}
	fields["total"] = time.Duration(r.Total).String()
	if len(r.Plan.Warnings) > 0 {
		fields["warnings"] = r.Plan.Warnings
	}
	if err := state.WriteReport(t.bundle, r); err != nil {
		return fmt.Errorf("write restore report: %w", err)
	}
	log.G(ctx).WithFields(fields).Info("restore report")
	return nil
}

// recordPhase adds a phase to the report.
func (t *task) recordPhase(ctx context.Context, name string, d time.Duration) {
	t.recMu.Lock()
	t.phases = append(t.phases, state.Phase{Name: name, Duration: config.Duration(d)})
	t.recMu.Unlock()
	t.saveReport(ctx)
}

// saveReport writes the report; a failure to is only logged: the report
// tells, the task record is what recovery relies on.
func (t *task) saveReport(ctx context.Context) {
	if err := t.writeReport(ctx); err != nil {
		log.G(ctx).WithError(err).WithField("id", t.id).Warn("write restore report")
	}
}
