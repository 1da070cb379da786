package qemu

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/vmmproc"
)

// Snapshots and restores are QEMU migrations of the device state only:
// guest RAM sits in a shared file (or memfd) that x-ignore-shared leaves
// out of the stream.
const (
	migrationEvents  = "events"
	migrationIgnored = "x-ignore-shared"
	migrationFD      = "migration"
)

// migrationCaps turns on what every migration here needs: guest RAM in a
// shared file is skipped, and MIGRATION events report the outcome.
func (v *VM) migrationCaps(ctx context.Context) error {
	type capability struct {
		Capability string `json:"capability"`
		State      bool   `json:"state"`
	}
	caps := []capability{{migrationIgnored, true}, {migrationEvents, true}}
	return v.command(ctx, "migrate-set-capabilities", map[string]any{"capabilities": caps})
}

// migrate runs command (migrate or migrate-incoming) over f, passed to
// QEMU as an fd: QEMU reads or writes the file itself, so the stream is
// complete when the MIGRATION event says so (an exec: helper could still
// be writing then), and no helper process can be left behind.
func (v *VM) migrate(ctx context.Context, command string, f *os.File) error {
	ctx, cancel := vmmproc.WithDefaultTimeout(ctx, migrateTimeout)
	defer cancel()
	if err := v.migrationCaps(ctx); err != nil {
		return err
	}
	if err := v.qmp.SendFile(ctx, migrationFD, f); err != nil {
		return err
	}
	wait, cancelWait := v.qmp.Expect(func(ev Event) bool {
		return ev.Name == "MIGRATION" && migrationFinished(ev.Data) != ""
	})
	defer cancelWait()
	if err := v.qmp.Execute(ctx, command, map[string]string{"uri": "fd:" + migrationFD}, nil); err != nil {
		return err
	}
	ev, err := wait(ctx)
	if err != nil {
		return fmt.Errorf("wait for %s: %w", command, err)
	}
	if status := migrationFinished(ev.Data); status != "completed" {
		return fmt.Errorf("%s %s: %s", command, status, v.migrationError(ctx))
	}
	return nil
}

// migrationFinished returns the final status in a MIGRATION event's data,
// or "" while the migration is still going.
func migrationFinished(data json.RawMessage) string {
	var d struct {
		Status string `json:"status"`
	}
	if json.Unmarshal(data, &d) != nil {
		return ""
	}
	switch d.Status {
	case "completed", "failed", "cancelled":
		return d.Status
	}
	return ""
}

func (v *VM) migrationError(ctx context.Context) string {
	var info struct {
		ErrorDesc string `json:"error-desc"`
	}
	if err := v.qmp.Execute(ctx, "query-migrate", nil, &info); err != nil {
		return err.Error()
	}
	if info.ErrorDesc == "" {
		return "no error description from qemu"
	}
	return info.ErrorDesc
}
