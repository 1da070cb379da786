package bench

import (
	"fmt"
	"slices"
	"strings"
)

// markdown is the results as tables; chart, if set, is linked below them.
func (r *results) markdown(chart string) string {
	var b strings.Builder
	m := r.Machine
	fmt.Fprintf(&b, "## Containers started at once, %s\n\n", r.Date.Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&b, "Machine: %s, %d CPUs, %d GiB, Linux %s, %s (%s). ", m.CPU, m.CPUs, m.MemGiB, m.Kernel, m.QEMU, m.Accel)
	fmt.Fprintf(&b, "1-minute load average %.1f when the run began and %.1f when it ended (other work shares the machine). ", r.Load.Start, r.Load.End)
	fmt.Fprintf(&b, "Snapshot: %d MiB guest, %d MiB of it non-zero. %d round(s) per cell, the arms interleaved within each round; p50/p95 over every clone of every round.\n\n",
		r.Snapshot.MemoryBytes>>20, r.Snapshot.DataBytes>>20, r.Rounds)
	b.WriteString(legend)
	r.cellTable(&b)
	r.wholeTable(&b)
	r.pullTable(&b)
	r.alternativeTable(&b)
	r.baselineTable(&b)
	r.ratioTables(&b)
	r.variantTable(&b, "With a network namespace (a veth to another namespace, as CNI leaves one) against containerd's default spec (a new namespace the shim makes, nothing to connect)",
		"shim mmap", "with network", r.Network)
	r.variantTable(&b, "An ordinary OCI image (busybox) on the snapshot image as base, its layers as an erofs disk, against the snapshot image itself",
		"chain image", "ordinary image", r.Ordinary)
	r.pooledTable(&b)
	r.conversionTable(&b)
	if len(r.FirstRestore) > 0 {
		b.WriteString("\nFirst restore of a new chain (staging flattens it once per node):")
		for _, f := range r.FirstRestore {
			fmt.Fprintf(&b, " %s %.0f ms, then %.1f ms from the flat cache;", f.Path, f.FirstMs, f.WarmMs)
		}
		b.WriteString("\n")
	}
	if chart != "" {
		fmt.Fprintf(&b, "\n![create-to-running p50 per clone](%s)\n", chart)
	}
	return b.String()
}

const legend = "Create to running: from creating the container (or staging the snapshot, or starting QEMU) to the process running in it. " +
	"`direct` is restore.Run on the QEMU driver over an in-process snapshotter; `shim` is containerd v2.4.2 + cocoon-snapshotter + the cocoon shim, driven by the Go client; " +
	"`runc` is the same containerd with Debian's runc, containerd-shim-runc-v2 v2.4.2 and overlayfs running the same command in a busybox image; " +
	"`cold` boots the snapshot's guest (same kernel, initramfs, command line, memory) with the QEMU driver instead of restoring it, to its agent and the process started: what a VM runtime without snapshots pays. " +
	"`network` gives each shim clone a network namespace with a veth; `ordinary` runs the busybox image on the snapshot image as base; " +
	"`baseline` is the shim path of another build (its shim, snapshotter, guest and snapshot image, through its own containerd), right after this build's.\n\n" +
	"VMM is the hypervisor's part (fill + spawn + load + resume, or a cold boot's start), what the restore mode changes; guest is the guest's part (agent + init + process started: sum of medians; for a cold boot the agent phase holds the kernel's boot); " +
	"outside is what no phase covers (on the shim path starting the shim and the task RPCs through containerd; the container phase is the client's NewContainer, which stages the snapshot). Phases are per-clone medians. " +
	"PSS (smaps_rollup) splits shared page cache among the clones mapping it; a copy restore also holds its guest RAM in a memfd whose untouched pages PSS does not count: held is PSS with the whole memfd instead. " +
	"Guest RAM is the guest memory alone; the rest of PSS is QEMU itself, under TCG mostly its translated-code buffer. For runc, PSS is the container's process.\n\n"

func (r *results) cellTable(b *strings.Builder) {
	b.WriteString("| N | arm | p50 ms | p95 ms | wall ms (all N) | VMM p50 ms | guest p50 ms | outside p50 ms | PSS MiB/clone | held MiB/clone | guest RAM MiB/clone | phases, p50 ms |\n" +
		"|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range r.Cells {
		fmt.Fprintf(b, "| %d | %s | %.0f | %.0f | %.0f | %s | %s | %.0f | %.1f | %.1f | %s | %s |\n", c.N, c.armID, c.P50Ms, c.P95Ms, c.WallMs,
			orDash(c.VMMP50Ms, "%.0f"), orDash(c.GuestP50Ms, "%.0f"), c.OutsideP50Ms, c.PSSMiB, c.HeldMiB, orDash(c.GuestMiB, "%.1f"), phaseList(c.Phases))
	}
	for _, c := range r.Cells {
		if c.Failed > 0 {
			fmt.Fprintf(b, "\n**%d of %d starts of %s at N=%d failed** and are left out of its samples (the JSON has the errors in full): %s\n",
				c.Failed, c.Failed+c.Samples, c.armID, c.N, shorten(strings.Join(c.Errors, "; "), maxErrorText))
		}
	}
}

// maxErrorText bounds an error in the tables; the JSON keeps it whole.
const maxErrorText = 300

// shorten puts s on one line and cuts it after n characters.
func shorten(s string, n int) string {
	r := []rune(strings.Join(strings.Fields(s), " "))
	if len(r) <= n {
		return string(r)
	}
	return string(r[:n]) + "…"
}

// alternativeTable puts cocoon beside runc and a cold boot per N.
func (r *results) alternativeTable(b *strings.Builder) {
	if len(r.Alternatives) == 0 {
		return
	}
	b.WriteString("\nAgainst runc and a cold boot: cocoon through containerd ÷ runc through the same containerd, and a cold boot ÷ a direct restore (neither through containerd). Guest is agent + init + process started.\n\n" +
		"| N | runc p50/p95 ms | shim mmap p50/p95 ms | shim copy p50/p95 ms | cold boot p50/p95 ms | mmap ÷ runc | copy ÷ runc | cold ÷ direct mmap | cold ÷ direct copy | guest p50 ms: mmap / copy / cold |\n" +
		"|---|---|---|---|---|---|---|---|---|---|\n")
	cs := cells(r.Cells)
	for _, a := range r.Alternatives {
		runc, cold := cs.find(armID{Path: PathRunc}, a.N), cs.find(armID{Path: PathCold}, a.N)
		mmap, cp := cs.find(armID{Path: PathShim, Mode: mmap}, a.N), cs.find(armID{Path: PathShim, Mode: copyMode}, a.N)
		fmt.Fprintf(b, "| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s / %s / %s |\n", a.N,
			p50p95(runc), p50p95(mmap), p50p95(cp), p50p95(cold),
			times(a.MmapOverRunc), times(a.CopyOverRunc), times(a.ColdOverMmap), times(a.ColdOverCopy),
			guestOf(mmap), guestOf(cp), guestOf(cold))
	}
}

func (r *results) ratioTables(b *strings.Builder) {
	if len(r.ModeRatios) > 0 {
		b.WriteString("\n| N | path | p50 copy ÷ mmap | VMM p50 copy ÷ mmap | PSS mmap ÷ copy | held mmap ÷ copy | guest RAM mmap ÷ copy |\n|---|---|---|---|---|---|---|\n")
		for _, x := range r.ModeRatios {
			fmt.Fprintf(b, "| %d | %s | %s | %s | %.2f | %.2f | %.2f |\n", x.N, x.Path, times(x.CopyOverMmap), times(x.VMMCopyOverMap), x.PSSMmapOverCpy, x.HeldMmapOverCp, x.RAMMmapOverCpy)
		}
	}
	if len(r.PathRatios) > 0 {
		b.WriteString("\n| N | mode | p50 shim ÷ direct |\n|---|---|---|\n")
		for _, x := range r.PathRatios {
			fmt.Fprintf(b, "| %d | %s | %s |\n", x.N, x.Mode, times(x.ShimOverDirect))
		}
	}
}

// variantTable compares one variant of shim mmap with plain shim mmap.
func (r *results) variantTable(b *strings.Builder, title, base, variant string, rows []variantRatio) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(b, "\n%s:\n\n| N | %s p50 ms | %s p50 ms | ÷ | %s phase p50 ms: %s / %s | guest p50 ms: %s / %s |\n|---|---|---|---|---|---|\n",
		title, base, variant, rows[0].Phase, base, variant, base, variant)
	for _, x := range rows {
		fmt.Fprintf(b, "| %d | %.0f | %.0f | %s | %s / %s | %.0f / %.0f |\n", x.N, x.BaseP50Ms, x.P50Ms, times(x.P50OverBase),
			optional(x.BasePhaseP50Ms), optional(x.PhaseP50Ms), x.BaseGuestP50Ms, x.GuestP50Ms)
	}
}

// pooledTable puts the bursts in pooled VMs beside runc's.
func (r *results) pooledTable(b *strings.Builder) {
	if len(r.Pooled) == 0 {
		return
	}
	fmt.Fprintf(b, "\nIn pooled VMs (`pooled_vm`, `spares = %d`; a set of its own, each round: the burst once the spares' VMs wait warm and the machine is quiet, "+
		"the same right after it while the spares refill, then runc): claimed is how many clones' creates claimed a VM; "+
		"before each burst, what the waiting VMs and their spares cost (PSS, and a VM's CPU time over a second; medians over rounds).\n\n", r.PooledSpares)
	b.WriteString("| N | runc p50/p95 ms | pooled p50/p95 ms (claimed) | right after p50/p95 ms (claimed) | pooled ÷ runc | right after ÷ runc | pooled ÷ shim mmap | waiting VMs | PSS MiB per VM / per spare | CPU per waiting VM |\n" +
		"|---|---|---|---|---|---|---|---|---|---|\n")
	cs := cells(r.Cells)
	for _, x := range r.Pooled {
		p := cs.find(armID{Path: PathShim, Mode: mmap, Variant: VariantPooled}, x.N)
		after := cs.find(armID{Path: PathShim, Mode: mmap, Variant: VariantRefilling}, x.N)
		runc := cs.find(armID{Path: PathRunc, Variant: VariantBesidePooled}, x.N)
		var cost poolCost
		if i := slices.IndexFunc(r.PoolCosts, func(c poolCost) bool { return c.N == x.N }); i >= 0 {
			cost = r.PoolCosts[i]
		}
		fmt.Fprintf(b, "| %d | %s | %s (%d of %d) | %s (%d of %d) | %s | %s | %s | %d | %.1f / %.1f | %.1f%% |\n", x.N, p50p95(runc),
			p50p95(p), p.Claimed, p.Samples, p50p95(after), after.Claimed, after.Samples,
			times(x.PooledOverRunc), times(x.RefillingOverRunc), times(x.PooledOverShim),
			cost.VMs, cost.VMPSSMiB, cost.SparePSSMiB, cost.VMCPU)
	}
}

func (r *results) conversionTable(b *strings.Builder) {
	if len(r.Conversions) == 0 {
		return
	}
	b.WriteString("\nFirst use of an ordinary image on a node (cocoon-snapshotter builds its erofs image in the first container Prepare; later ones stage it by hard link), one image per size:\n\n" +
		"| image MiB | first Prepare ms | cached Prepare ms |\n|---|---|---|\n")
	for _, c := range r.Conversions {
		fmt.Fprintf(b, "| %.1f | %.0f | %.1f |\n", float64(c.ImageBytes)/(1<<20), c.FirstMs, c.CachedMs)
	}
}

func phaseList(ps []phaseStat) string {
	parts := make([]string, 0, len(ps))
	for _, p := range ps {
		parts = append(parts, fmt.Sprintf("%s %.0f", p.Name, p.P50Ms))
	}
	return strings.Join(parts, ", ")
}

// orDash formats v, or a dash for a measure the cell does not have.
func orDash(v float64, format string) string {
	if v == 0 {
		return "–"
	}
	return fmt.Sprintf(format, v)
}

// optional formats a measure a cell may not have.
func optional(v *float64) string {
	if v == nil {
		return "–"
	}
	return fmt.Sprintf("%.1f", *v)
}

func times(x float64) string { return orDash(x, "%.2f×") }

func p50p95(c *cellResult) string {
	if c == nil {
		return "–"
	}
	return fmt.Sprintf("%.0f / %.0f", c.P50Ms, c.P95Ms)
}

func guestOf(c *cellResult) string {
	if c == nil {
		return "–"
	}
	return orDash(c.GuestP50Ms, "%.0f")
}
