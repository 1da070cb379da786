package main

import (
	"encoding/json"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// TestBenchSmoke runs the benchmark small (N=2, mmap, both paths, one
// round) so `make test` keeps it working: a real snapshot restored by real
// QEMU, directly and through containerd and the shim.
func TestBenchSmoke(t *testing.T) {
	testenv.QEMU(t)
	guest := testenv.Guest(t)
	bin := filepath.Dir(testenv.Bin(t, "containerd"))
	for _, name := range []string{"ctr", "cocoon-snapshotter", "containerd-shim-cocoon-v2"} {
		testenv.Bin(t, name)
	}
	out, readme := t.TempDir(), filepath.Join(t.TempDir(), "README.md")
	if err := os.WriteFile(readme, []byte("# x\n"+sectionBegin+"\nSTALE-RESULTS\n"+sectionEnd+"\ntail\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := runBench(t.Context(), io.Discard, benchOptions{
		ns: []int{2}, modes: []hypervisor.Mode{hypervisor.ModeMmap}, paths: benchPaths, rounds: 1,
		guest: guest, cache: filepath.Join(testenv.RepoRoot(), "build", "snapshots"), memory: "512M",
		binDir: bin, out: out, readme: readme,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Cells) != 2 {
		t.Fatalf("got %d cells, want 2 (direct and shim): %+v", len(res.Cells), res.Cells)
	}
	for _, c := range res.Cells {
		if c.Samples != 2 || c.P50Ms <= 0 || c.PSSMiB <= 0 || len(c.Phases) == 0 {
			t.Errorf("cell %s %s n=%d: %d samples, p50 %v ms, pss %v MiB, %d phases: want 2 samples and positive measures",
				c.Path, c.Mode, c.N, c.Samples, c.P50Ms, c.PSSMiB, len(c.Phases))
		}
	}
	if len(res.PathRatios) != 1 || len(res.FirstRestore) != 2 {
		t.Errorf("got %d path ratios and %d first-restore costs, want 1 and 2", len(res.PathRatios), len(res.FirstRestore))
	}
	checkResultFiles(t, out, readme)
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
			var r benchResults
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
	if err != nil || !strings.Contains(string(readme), "| 2 | mmap | shim |") ||
		strings.Contains(string(readme), "STALE-RESULTS") || !strings.HasSuffix(string(readme), sectionEnd+"\ntail\n") {
		t.Errorf("README.md lacks the results table (err %v):\n%s", err, readme)
	}
}

func TestBenchFlags(t *testing.T) {
	tests := []struct {
		name  string
		parse func() error
		ok    bool
	}{
		{"counts", func() error { _, err := parseCounts("1,8,16"); return err }, true},
		{"zero count", func() error { _, err := parseCounts("0"); return err }, false},
		{"word count", func() error { _, err := parseCounts("1,x"); return err }, false},
		{"modes", func() error { _, err := parseModes("copy,mmap"); return err }, true},
		{"bad mode", func() error { _, err := parseModes("lazy"); return err }, false},
		{"paths", func() error { _, err := parsePaths("direct,shim"); return err }, true},
		{"bad path", func() error { _, err := parsePaths("runc"); return err }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.parse(); (err == nil) != tt.ok {
				t.Errorf("err = %v, want ok %v", err, tt.ok)
			}
		})
	}
}

func TestSummarizeAndRatios(t *testing.T) {
	d := func(msec int) time.Duration { return time.Duration(msec) * time.Millisecond }
	copyRun := cellRun{ready: []time.Duration{d(400), d(100), d(300), d(200)}, wall: d(450),
		mem: []cloneMemory{{pss: 2048, held: 4096, guest: 3072}, {pss: 2048, held: 4096, guest: 1024}}}
	mmapRun := cellRun{ready: []time.Duration{d(100), d(100)}, wall: d(120),
		mem:    []cloneMemory{{pss: 512, held: 512, guest: 512}, {pss: 512, held: 512, guest: 512}},
		phases: [][]phase{{{"spawn", d(10)}, {"agent", d(80)}}, {{"spawn", d(30)}, {"agent", d(60)}}}}
	cells := []cellResult{
		summarize(cellKey{"direct", "copy", 4}, []cellRun{copyRun}),
		summarize(cellKey{"direct", "mmap", 4}, []cellRun{mmapRun}),
		summarize(cellKey{"shim", "mmap", 4}, []cellRun{mmapRun, mmapRun}),
	}
	if c := cells[0]; c.P50Ms != 200 || c.P95Ms != 400 || c.WallMs != 450 || c.PSSMiB != 2 || c.HeldMiB != 4 || c.GuestMiB != 2 || c.Samples != 4 {
		t.Errorf("copy cell = %+v, want p50 200 p95 400 wall 450 pss 2 held 4 guest 2 samples 4", c)
	}
	if c := cells[1]; c.VMMP50Ms != 10 || c.OutsideP50Ms != 10 {
		t.Errorf("mmap cell vmm %v ms, outside %v ms: want 10 and 10", c.VMMP50Ms, c.OutsideP50Ms)
	}
	if ps := cells[1].Phases; len(ps) != 2 || ps[0].Name != "spawn" || ps[0].P50Ms != 10 || ps[1].P50Ms != 60 {
		t.Errorf("mmap phases = %+v, want spawn 10, agent 60 (nearest-rank p50)", ps)
	}
	mr, pr := ratios(cells)
	if len(mr) != 1 || mr[0].CopyOverMmap != 2 || mr[0].PSSMmapOverCpy != 0.25 || mr[0].HeldMmapOverCp != 0.13 || mr[0].RAMMmapOverCpy != 0.25 {
		t.Errorf("mode ratios = %+v, want copy/mmap 2, pss 0.25, held 0.13, guest ram 0.25", mr)
	}
	if len(pr) != 1 || pr[0].Mode != "mmap" || pr[0].ShimOverDirect != 1 {
		t.Errorf("path ratios = %+v, want one mmap ratio of 1", pr)
	}
	r := &benchResults{Cells: cells}
	if err := xml.Unmarshal([]byte(r.svg()), new(struct{})); err != nil {
		t.Errorf("chart is not well-formed XML: %v", err)
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
