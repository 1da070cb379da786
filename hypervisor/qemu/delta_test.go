package qemu

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// A fork restores from its parent chain's flat file with its own pages
// written into the guest, in both modes: the clone has the file and the
// counter, the shared file is unchanged, and a fork of the clone holds
// only what changed since its restore, not the pages the restore wrote.
func TestRestoreWritesDeltas(t *testing.T) {
	d := newTestDriver(t)
	base := bakedLink(t, d)
	root := t.TempDir()
	s := newStager(t, root, base)
	v, c := restoreReady(t, d, hypervisor.RestoreRequest{StagedDir: s.stage(), RunDir: s.runDir(), Mode: hypervisor.ModeMmap})
	mark := randomMark(t)
	sh(t, c, "echo "+mark+" > /dev/shm/marker")
	sh(t, c, counterStart)
	sh(t, c, counterInc+"; "+counterInc+"; "+dirtyEight)
	fork1 := filepath.Join(root, "fork1")
	if err := v.Snapshot(testContext(t, time.Minute), fork1, hypervisor.SnapshotDiff); err != nil {
		t.Fatal(err)
	}
	v.Close()
	l1, err := chain.ReadLink(fork1)
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []hypervisor.Mode{hypervisor.ModeMmap, hypervisor.ModeCopy} {
		t.Run(string(mode), func(t *testing.T) {
			dir := t.TempDir()
			ds := newDeltaStager(t, dir, 1, base, fork1)
			before := fileSHA256(t, ds.flat)
			var phases []string
			req := hypervisor.RestoreRequest{StagedDir: ds.stage(), RunDir: ds.runDir(), Mode: mode,
				OnPhase: func(p string, _ time.Duration) { phases = append(phases, p) }}
			v2, c2 := restoreReady(t, d, req)
			if !slices.Contains(phases, "delta") {
				t.Errorf("restore phases %v, want a delta phase", phases)
			}
			if got := sh(t, c2, "cat /dev/shm/marker"); got != mark {
				t.Errorf("marker %q, want %q", got, mark)
			}
			if n := counter(t, c2); n != 2 {
				t.Errorf("counter %d, want the fork's 2", n)
			}
			sh(t, c2, counterInc+"; echo after > /dev/shm/after")
			fork2 := filepath.Join(dir, "fork2")
			ctx := testContext(t, time.Minute)
			if err := v2.Snapshot(ctx, fork2, hypervisor.SnapshotDiff); err != nil {
				t.Fatal(err)
			}
			now, restored := filepath.Join(dir, "now"), filepath.Join(dir, "restored")
			dumpMemory(t, v2, now)
			if err := chain.Flatten(ctx, []string{base, fork1}, restored); err != nil {
				t.Fatal(err)
			}
			changed := testenv.DifferingPages(t, now, restored) * 4096
			l2, err := chain.ReadLink(fork2)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("first fork %d KiB; the clone changed %d KiB, its fork carries %d KiB", l1.Memory.DataBytes>>10, changed>>10, l2.Memory.DataBytes>>10)
			if l2.Memory.DataBytes < changed || l2.Memory.DataBytes > changed+changed/10 {
				t.Errorf("fork of the clone carries %d bytes for %d changed since its restore", l2.Memory.DataBytes, changed)
			}
			all := filepath.Join(dir, "all")
			if err := chain.Flatten(ctx, []string{base, fork1, fork2}, all); err != nil {
				t.Fatal(err)
			}
			if !sameFile(t, all, now) {
				t.Error("the three-link chain does not flatten to the clone's memory")
			}
			if after := fileSHA256(t, ds.flat); after != before {
				t.Error("the restore wrote into the shared flat file")
			}
		})
	}
}
