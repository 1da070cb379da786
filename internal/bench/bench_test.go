package bench

import (
	"encoding/json"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// TestBenchSmoke runs the benchmark small (N=2, mmap, one round) so `make
// test` keeps every arm working: a real snapshot restored by real QEMU,
// directly and through containerd and the shim, with a network namespace
// and with an ordinary image; runc through the same containerd; a cold boot
// of the same guest; the first use of an ordinary image; and the whole
// start of each of its arms (cocoon's two image kinds, runc, gVisor).
func TestBenchSmoke(t *testing.T) {
	testenv.QEMU(t)
	testenv.LookPath(t, "runc")
	testenv.LookPath(t, "runsc")
	testenv.LookPath(t, "mkfs.erofs")
	guest := testenv.Guest(t)
	bin := filepath.Dir(testenv.Bin(t, "containerd"))
	for _, name := range []string{"ctr", "cocoon-snapshotter", "containerd-shim-cocoon-v2", "cocoon-shim-server", runcShim, "cocoonctl", "crane"} {
		testenv.Bin(t, name)
	}
	out, readme := t.TempDir(), filepath.Join(t.TempDir(), "README.md")
	if err := os.WriteFile(readme, []byte("# x\n"+sectionBegin+"\nSTALE-RESULTS\n"+sectionEnd+"\ntail\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := run(t.Context(), io.Discard, Options{
		Ns: []int{2}, Modes: []hypervisor.Mode{hypervisor.ModeMmap}, Paths: Paths,
		NetworkNs: []int{2}, OrdinaryNs: []int{2}, PooledNs: []int{2}, ConvertPads: []int64{1 << 20}, Rounds: 1, WholeRounds: 1, PullRounds: 1,
		Guest: guest, Cache: filepath.Join(testenv.RepoRoot(), "build", "snapshots"), Memory: "512M",
		BinDir: bin, Out: out, Readme: readme,
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"direct mmap", "shim mmap", "runc", "cold", "shim mmap network", "shim mmap ordinary",
		"shim mmap pooled", "shim mmap pooled right after", "runc beside pooled"}
	if len(res.Cells) != len(want) {
		t.Fatalf("got %d cells, want %d (%v): %+v", len(res.Cells), len(want), want, res.Cells)
	}
	for i, c := range res.Cells {
		if c.armID.String() != want[i] || c.Samples != 2 || c.Failed != 0 || c.P50Ms <= 0 || c.PSSMiB <= 0 || len(c.Phases) == 0 {
			t.Errorf("cell %d %s n=%d: %d samples, %d failed %q, p50 %v ms, pss %v MiB, %d phases: want %s, 2 samples and positive measures",
				i, c.armID, c.N, c.Samples, c.Failed, c.Errors, c.P50Ms, c.PSSMiB, len(c.Phases), want[i])
		}
	}
	checkRatios(t, res)
	checkResultFiles(t, out, readme)
}

// checkRatios checks the smoke run's comparisons are all there.
func checkRatios(t *testing.T, res *results) {
	t.Helper()
	if len(res.PathRatios) != 1 || len(res.FirstRestore) != 2 || len(res.Conversions) != 1 {
		t.Errorf("got %d path ratios, %d first-restore costs, %d conversions: want 1, 2 and 1", len(res.PathRatios), len(res.FirstRestore), len(res.Conversions))
	}
	if len(res.Alternatives) != 1 || res.Alternatives[0].MmapOverRunc <= 0 || res.Alternatives[0].ColdOverMmap <= 0 {
		t.Errorf("alternatives %+v: want one row with mmap ÷ runc and cold ÷ mmap", res.Alternatives)
	}
	if len(res.Network) != 1 || res.Network[0].PhaseP50Ms == nil {
		t.Errorf("network rows %+v: want one with a network phase", res.Network)
	}
	if len(res.Ordinary) != 1 || res.Ordinary[0].P50OverBase <= 0 {
		t.Errorf("ordinary rows %+v: want one with a ratio", res.Ordinary)
	}
	if len(res.Pooled) != 1 || res.Pooled[0].PooledOverRunc <= 0 {
		t.Errorf("pooled rows %+v: want one with a ratio", res.Pooled)
	}
	if len(res.PoolCosts) != 1 || res.PoolCosts[0].VMs < 2 || res.PoolCosts[0].VMPSSMiB <= 0 || res.PoolCosts[0].SparePSSMiB <= 0 {
		t.Errorf("pool costs %+v: want the 2 waiting VMs' and spares' memory", res.PoolCosts)
	}
	if c := cells(res.Cells).find(armID{Path: PathShim, Mode: mmap, Variant: VariantPooled}, 2); c == nil || c.Claimed != 2 {
		t.Errorf("pooled cell %+v: want both clones' creates to claim a pooled VM", c)
	}
	if p := res.Pull; p == nil || p.Bytes <= 0 || len(p.Rows) != 2 || p.Rows[0].PullMs <= 0 || p.Rows[0].RunMs <= 0 || p.Rows[1].PullMs <= 0 || p.Rows[1].RunMs != 0 {
		t.Errorf("empty node %+v: want the image's bytes, the snapshot image's pull and first run, and the ordinary pull alone", p)
	}
	if n := len(res.Whole); n < 10 || n > 12 {
		t.Fatalf("whole start rows %+v: want one per arm (4), then for each pooled VM its own (and its claimed runs', if it claimed) and its peers' (3)", res.Whole)
	}
	for _, w := range res.Whole {
		if strings.HasSuffix(w.Arm, claimedRuns) {
			continue
		}
		var sum float64
		for _, p := range w.PhaseMs {
			if p < 0 {
				t.Errorf("whole start %s: a phase of %v ms", w.Arm, p)
			}
			sum += p
		}
		if w.Runs != 1 || len(w.PhaseMs) != len(wholePhases) || sum < w.TotalMs*0.99 || sum > w.TotalMs*1.01 {
			t.Errorf("whole start %s: %d runs, %v ms in phases %v: want 1 run and phases that add up to it", w.Arm, w.Runs, w.TotalMs, w.PhaseMs)
		}
		checkTeardown(t, w)
	}
}

// checkTeardown: cocoon's shim publishes the task's exit and delete, so
// its arms' end is split, into parts that add up to it.
func checkTeardown(t *testing.T, w WholeRow) {
	t.Helper()
	if w.Arm != WholeSnapshot && w.Arm != WholeOrdinary {
		return
	}
	var sum float64
	for _, p := range w.TeardownMs {
		if p < 0 {
			t.Errorf("whole start %s: a teardown part of %v ms", w.Arm, p)
		}
		sum += p
	}
	end := w.PhaseMs[3] // process, task delete, container delete
	if w.TeardownRuns != 1 || len(w.TeardownMs) != len(teardownPhases) || sum < end*0.99-0.01 || sum > end*1.01+0.01 {
		t.Errorf("whole start %s: teardown %v ms in %d runs, want 1 run split into parts that add up to %v", w.Arm, w.TeardownMs, w.TeardownRuns, end)
	}
}

// checkResultFiles checks the bench wrote a JSON, markdown and SVG that
// parse, and the table into the readme.
func checkResultFiles(t *testing.T, dir, readmePath string) {
	t.Helper()
	for _, ext := range []string{"json", "md", "svg"} {
		files, _ := filepath.Glob(filepath.Join(dir, "*."+ext))
		if len(files) != 1 {
			t.Fatalf("found %d .%s result files, want 1", len(files), ext)
		}
		data, err := os.ReadFile(files[0])
		if err != nil {
			t.Fatal(err)
		}
		switch ext {
		case "json":
			var r results
			if err := json.Unmarshal(data, &r); err != nil {
				t.Errorf("results JSON: %v", err)
			}
		case "svg":
			if err := xml.Unmarshal(data, new(struct{})); err != nil {
				t.Errorf("chart is not well-formed XML: %v", err)
			}
		}
	}
	readme, err := os.ReadFile(readmePath)
	if err != nil || !strings.Contains(string(readme), "| 2 | shim mmap |") ||
		strings.Contains(string(readme), "STALE-RESULTS") || !strings.HasSuffix(string(readme), sectionEnd+"\ntail\n") {
		t.Errorf("README.md lacks the results table (err %v):\n%s", err, readme)
	}
}

func TestReplaceSection(t *testing.T) {
	tests := []struct {
		name, in, want, wantErr string
	}{
		{name: "replaces between markers", in: "a\n" + sectionBegin + "\nold\n" + sectionEnd + "\nb\n",
			want: "a\n" + sectionBegin + "\nnew\n" + sectionEnd + "\nb\n"},
		{name: "no markers", in: "a\n", wantErr: "no " + sectionBegin},
		{name: "no end marker", in: sectionBegin + "\nold\n", wantErr: "no " + sectionBegin},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "README.md")
			if err := os.WriteFile(p, []byte(tt.in), 0o644); err != nil {
				t.Fatal(err)
			}
			err := replaceSection(p, "new\n")
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			got, _ := os.ReadFile(p)
			if err != nil || string(got) != tt.want {
				t.Fatalf("got %q (err %v), want %q", got, err, tt.want)
			}
		})
	}
}

// baselineTree is a directory laid out as a built tree.
func baselineTree(t *testing.T) string {
	dir := t.TempDir()
	for _, p := range []string{"bin/containerd-shim-cocoon-v2", "bin/cocoon-snapshotter", "bin/cocoonctl", "bin/containerd", "build/guest/initramfs.cpio.gz"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestOptionsValidate(t *testing.T) {
	ok := Options{Ns: []int{1, 8}, Paths: Paths, NetworkNs: []int{8}, Rounds: 1}
	tests := []struct {
		name   string
		change func(*Options)
		ok     bool
	}{
		{"defaults", func(*Options) {}, true},
		{"no counts", func(o *Options) { o.Ns = nil }, false},
		{"no rounds", func(o *Options) { o.Rounds = 0 }, false},
		{"unknown path", func(o *Options) { o.Paths = []string{"kata"} }, false},
		{"network at a count not run", func(o *Options) { o.NetworkNs = []int{4} }, false},
		{"ordinary at a count not run", func(o *Options) { o.OrdinaryNs = []int{16} }, false},
		{"pooled", func(o *Options) { o.PooledNs = []int{1, 8} }, true},
		{"pooled at a count not run", func(o *Options) { o.PooledNs = []int{16} }, false},
		{"pooled burst beyond the spares", func(o *Options) { o.Ns, o.PooledNs = []int{1, 17}, []int{17} }, false},
		{"baseline", func(o *Options) { o.Baseline, o.BaselineNs = baselineTree(t), []int{1} }, true},
		{"baseline without a build", func(o *Options) { o.Baseline, o.BaselineNs = t.TempDir(), []int{1} }, false},
		{"baseline at a count not run", func(o *Options) { o.Baseline, o.BaselineNs = baselineTree(t), []int{4} }, false},
		{"baseline without counts", func(o *Options) { o.Baseline = baselineTree(t) }, false},
		{"baseline without the shim path", func(o *Options) {
			o.Baseline, o.BaselineNs, o.Paths = baselineTree(t), []int{1}, []string{PathDirect}
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := ok
			tt.change(&o)
			if err := o.validate(); (err == nil) != tt.ok {
				t.Errorf("validate() = %v, want ok %v", err, tt.ok)
			}
		})
	}
}
