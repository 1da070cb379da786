package firecracker

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/drivertest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/apifake"
)

// Firecracker loads with dirty page tracking, so every restore mode makes
// diff links of what changed since the restore, over several snapshots.
func TestDiffSnapshots(t *testing.T) {
	for _, mode := range restoreModes {
		t.Run(string(mode), func(t *testing.T) {
			d, record := newDriver(t, apifake.Fake{GuestWrites: drivertest.DiffRounds})
			drivertest.DiffSnapshots(t, d, stageChain(t), mode, false)
			load := apifake.Bodies(t, record, "PUT", "snapshot/load")
			if len(load) != 1 || load[0]["track_dirty_pages"] != true {
				t.Errorf("snapshot/load %v, want track_dirty_pages", load)
			}
			for _, c := range apifake.Bodies(t, record, "PUT", "snapshot/create") {
				if c["snapshot_type"] != "Diff" {
					t.Errorf("snapshot/create %v, want Diff", c)
				}
			}
		})
	}
}

// A full snapshot restarts Firecracker's dirty log: a diff after it is
// refused, for the shim to write a full link.
func TestDiffAfterFull(t *testing.T) {
	ctx := context.Background()
	d, _ := newDriver(t, apifake.Fake{})
	v, err := d.Restore(ctx, hypervisor.RestoreRequest{StagedDir: stageChain(t), RunDir: drivertest.RunDir(t), Mode: hypervisor.ModeMmap})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	snap := v.(hypervisor.Checkpointer)
	if err := snap.Snapshot(ctx, filepath.Join(t.TempDir(), "full"), hypervisor.SnapshotFull); err != nil {
		t.Fatal(err)
	}
	if err := snap.Snapshot(ctx, filepath.Join(t.TempDir(), "diff"), hypervisor.SnapshotDiff); !errors.Is(err, hypervisor.ErrNoDiffBase) {
		t.Errorf("diff after a full snapshot: %v, want ErrNoDiffBase", err)
	}
}
