package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/qemu"
)

// machineInfo says where the numbers came from.
type machineInfo struct {
	CPU      string `json:"cpu"`
	CPUs     int    `json:"cpus"`
	MemGiB   int64  `json:"memGiB"`
	Kernel   string `json:"kernel"`
	QEMU     string `json:"qemu"`
	Accel    string `json:"accel"`
	Hostname string `json:"hostname"`
}

func probeMachine(ctx context.Context) (machineInfo, error) {
	cfg, err := config.Load("")
	if err != nil {
		return machineInfo{}, err
	}
	drv := qemu.New(cfg.QEMU)
	build, err := drv.Build(ctx)
	if err != nil {
		return machineInfo{}, err
	}
	accel, _, err := drv.Accel()
	if err != nil {
		return machineInfo{}, err
	}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return machineInfo{}, fmt.Errorf("uname: %w", err)
	}
	host, _ := os.Hostname()
	m := machineInfo{
		CPU: cpuinfo("model name"), CPUs: runtime.NumCPU(), MemGiB: memTotalGiB(),
		Kernel: unix.ByteSliceToString(uts.Release[:]), QEMU: build, Accel: accel, Hostname: host,
	}
	return m, nil
}

func cpuinfo(key string) string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func memTotalGiB() int64 {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 0
	}
	return int64(si.Totalram) * int64(si.Unit) >> 30
}

// writeResults writes <date>.json, .md and .svg into dir, and the table
// and chart into readme if set.
func writeResults(r *benchResults, dir, readme string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create results dir: %w", err)
	}
	stamp := r.Date.Format("2006-01-02T150405Z")
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	svg := stamp + ".svg"
	files := map[string]string{
		stamp + ".json": string(data) + "\n",
		stamp + ".md":   r.markdown(svg),
		svg:             r.svg(),
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			return fmt.Errorf("write results: %w", err)
		}
	}
	if readme == "" {
		return nil
	}
	rel, err := filepath.Rel(filepath.Dir(readme), filepath.Join(dir, svg))
	if err != nil {
		return fmt.Errorf("chart path: %w", err)
	}
	return replaceSection(readme, r.markdown(rel))
}

// The part of a readme that bench rewrites; the rest is left alone.
const (
	sectionBegin = "<!-- bench:begin -->"
	sectionEnd   = "<!-- bench:end -->"
)

// replaceSection puts body between the bench markers in the file at path.
func replaceSection(path, body string) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read readme: %w", err)
	}
	before, rest, ok1 := strings.Cut(string(old), sectionBegin)
	_, after, ok2 := strings.Cut(rest, sectionEnd)
	if !ok1 || !ok2 {
		return fmt.Errorf("%s: no %s ... %s section to write the results into", path, sectionBegin, sectionEnd)
	}
	text := before + sectionBegin + "\n" + body + sectionEnd + after
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// markdown is the results as tables; chart, if set, is linked below them.
func (r *benchResults) markdown(chart string) string {
	var b strings.Builder
	m := r.Machine
	fmt.Fprintf(&b, "## Fan-out restore, %s\n\n", r.Date.Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&b, "Machine: %s, %d CPUs, %d GiB, Linux %s, %s (%s). ", m.CPU, m.CPUs, m.MemGiB, m.Kernel, m.QEMU, m.Accel)
	fmt.Fprintf(&b, "Snapshot: %d MiB guest, %d MiB of it non-zero. %d round(s) per cell; p50/p95 over every clone of every round.\n\n",
		r.Snapshot.MemoryBytes>>20, r.Snapshot.DataBytes>>20, r.Rounds)
	b.WriteString("Create to running: from staging the snapshot to the guest reporting the process started. " +
		"PSS (smaps_rollup) splits shared page cache among the clones mapping it; a copy restore also holds its guest RAM in a memfd whose untouched pages PSS does not count: held is PSS with the whole memfd instead. Guest RAM is the guest memory alone (the PSS of its mapping, or the memfd); the rest of PSS is QEMU itself, under TCG mostly its translated-code buffer. " +
		"`direct` is restore.Run on the QEMU driver over an in-process snapshotter; `shim` is containerd v2.4.2 + cocoon-snapshotter + the cocoon shim, driven by the Go client.\n\n")
	b.WriteString("VMM is the hypervisor's part of a restore (fill + spawn + load + resume), what the mode changes; outside is what no phase covers (on the shim path: starting the shim and the task RPCs through containerd; the container phase is the client's NewContainer, which stages the snapshot). Phases are per-clone medians.\n\n")
	b.WriteString("| N | mode | path | p50 ms | p95 ms | wall ms (all N) | VMM p50 ms | outside p50 ms | PSS MiB/clone | held MiB/clone | guest RAM MiB/clone | restore phases, p50 ms |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range r.Cells {
		fmt.Fprintf(&b, "| %d | %s | %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.1f | %.1f | %.1f | %s |\n", c.N, c.Mode, c.Path, c.P50Ms, c.P95Ms, c.WallMs,
			c.VMMP50Ms, c.OutsideP50Ms, c.PSSMiB, c.HeldMiB, c.GuestMiB, phaseList(c.Phases))
	}
	if len(r.ModeRatios) > 0 {
		b.WriteString("\n| N | path | p50 copy ÷ mmap | VMM p50 copy ÷ mmap | PSS mmap ÷ copy | held mmap ÷ copy | guest RAM mmap ÷ copy |\n|---|---|---|---|---|---|---|\n")
		for _, x := range r.ModeRatios {
			fmt.Fprintf(&b, "| %d | %s | %.2f× | %.2f× | %.2f | %.2f | %.2f |\n", x.N, x.Path, x.CopyOverMmap, x.VMMCopyOverMap, x.PSSMmapOverCpy, x.HeldMmapOverCp, x.RAMMmapOverCpy)
		}
	}
	if len(r.PathRatios) > 0 {
		b.WriteString("\n| N | mode | p50 shim ÷ direct |\n|---|---|---|\n")
		for _, x := range r.PathRatios {
			fmt.Fprintf(&b, "| %d | %s | %.2f× |\n", x.N, x.Mode, x.ShimOverDirect)
		}
	}
	b.WriteString("\nFirst restore of a new chain (staging flattens it once per node):")
	for _, f := range r.FirstRestore {
		fmt.Fprintf(&b, " %s %.0f ms, then %.1f ms from the flat cache;", f.Path, f.FirstMs, f.WarmMs)
	}
	b.WriteString("\n")
	if chart != "" {
		fmt.Fprintf(&b, "\n![create-to-running p50 per clone](%s)\n", chart)
	}
	return b.String()
}

func phaseList(ps []phaseStat) string {
	parts := make([]string, 0, len(ps))
	for _, p := range ps {
		parts = append(parts, fmt.Sprintf("%s %.0f", p.Name, p.P50Ms))
	}
	return strings.Join(parts, ", ")
}
