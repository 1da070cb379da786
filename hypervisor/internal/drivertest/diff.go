package drivertest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/apifake"
)

const page = 4096

// DiffRounds is what the fake guest writes in DiffSnapshots: pages 1-2,
// then page 2 again and page 9 (which held data) back to zeros.
var DiffRounds = [][]apifake.GuestWrite{
	{{Offset: page, Length: 2 * page, Fill: 0xa1}},
	{{Offset: 2 * page, Length: page, Fill: 0xb2}, {Offset: 9 * page, Length: page, Fill: 0}},
}

// DiffSnapshots restores staged with d (whose fake guest writes
// DiffRounds) in mode and takes a diff snapshot after each round: each must
// be a link on the staged chain's top holding exactly the pages written
// since the restore, with their latest bytes. A copy restore's staged
// memory is removed first, as restore.Run does; noBase says the driver then
// has nothing to tell changes by, and must say so with ErrNoDiffBase.
func DiffSnapshots(t *testing.T, d hypervisor.Driver, staged string, mode hypervisor.Mode, noBase bool) {
	ctx := context.Background()
	st, err := chain.OpenStaged(staged)
	if err != nil {
		t.Fatal(err)
	}
	base, err := os.ReadFile(st.MemoryPath())
	if err != nil {
		t.Fatal(err)
	}
	v, err := d.Restore(ctx, hypervisor.RestoreRequest{StagedDir: staged, RunDir: RunDir(t), Mode: mode})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if mode == hypervisor.ModeCopy {
		if err := os.Remove(st.MemoryPath()); err != nil {
			t.Fatal(err)
		}
	}
	want := bytes.Clone(base)
	for i, round := range DiffRounds {
		if err := v.Resume(ctx); err != nil {
			t.Fatal(err)
		}
		if err := v.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		for _, w := range round {
			copy(want[w.Offset:], bytes.Repeat([]byte{w.Fill}, int(w.Length)))
		}
		dir := filepath.Join(t.TempDir(), "link")
		err := v.(hypervisor.Checkpointer).Snapshot(ctx, dir, hypervisor.SnapshotDiff)
		if noBase {
			if !errors.Is(err, hypervisor.ErrNoDiffBase) {
				t.Fatalf("diff of a %s restore: %v, want ErrNoDiffBase", mode, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("diff %d: %v", i+1, err)
		}
		checkDiff(t, dir, st.Top(), base, want)
	}
}

// checkDiff checks the link in dir follows top and, applied to base, makes
// want, writing only pages that differ.
func checkDiff(t *testing.T, dir string, top *chain.Link, base, want []byte) {
	t.Helper()
	l, err := chain.Validate(dir, top)
	if err != nil {
		t.Fatalf("diff link: %v", err)
	}
	got := bytes.Clone(base)
	var changed int64
	err = chain.ReadPages(context.Background(), filepath.Join(dir, chain.ExtentsFile), filepath.Join(dir, chain.DataFile), l, func(off int64, b []byte) error {
		copy(got[off:], b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for off := 0; off < len(base); off += page {
		if !bytes.Equal(base[off:off+page], want[off:off+page]) {
			changed += page
		}
	}
	if !bytes.Equal(got, want) || l.Memory.DataBytes != changed {
		t.Fatalf("diff link of %d bytes makes other memory than the guest's (%d bytes changed since the restore)", l.Memory.DataBytes, changed)
	}
}
