// Package bench measures how long a container takes from create to its
// process running when N start at once, and what each costs in memory:
// cocoon restoring a snapshot (copy and mmap, directly through the driver
// and through containerd and the shim, with a network namespace, with an
// ordinary image), runc, and a cold boot of the same guest. The arms take
// turns within every round, so each ratio compares measurements made side
// by side. Results go to <out>/<date>.{json,md,svg} and, if asked, between
// the bench markers of a readme.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/stackrun"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/spare"
)

// Paths are the ways to start a container Options.Paths chooses from.
var Paths = []string{PathDirect, PathShim, PathRunc, PathCold}

// Options say which cells run and where the results go.
type Options struct {
	Ns    []int             // counts of clones started at once
	Modes []hypervisor.Mode // restore modes of the direct and shim paths
	Paths []string          // from Paths
	// NetworkNs are the counts at which shim mmap also runs with a network
	// namespace per clone; none turns that arm off.
	NetworkNs []int
	// OrdinaryNs are the counts at which shim mmap also runs an ordinary
	// image; none turns that arm off.
	OrdinaryNs []int
	// ConvertPads are the sizes of random data added to the busybox image
	// whose first use on the node is measured, one image each; none
	// measures nothing.
	ConvertPads []int64
	// Baseline, when set, is the tree of another build (make build guest
	// there) whose shim path also runs, in every mode, at BaselineNs (see
	// VariantBaseline); BaselineLabel names it in the results.
	Baseline      string
	BaselineLabel string
	BaselineNs    []int
	Rounds        int // times each cell runs; samples are pooled
	// WholeRounds is how many times each arm of the whole start (`ctr run
	// --rm IMAGE ID echo hi` timed as a process) runs; 0 turns it off.
	WholeRounds int
	// PullRounds is how many times each arm of the empty node (pull, then
	// the first run) runs; 0 turns it off.
	PullRounds int
	// PooledNs are the counts at which shim mmap also starts in pooled
	// VMs (measurePooled), runc beside it; none turns that set off.
	PooledNs []int
	Guest    string
	Cache    string // the snapshot image cache
	Memory   string // the snapshot's guest memory, e.g. 512M
	BinDir   string // make build's binaries
	Out      string // results dir
	Readme   string // also write the table and chart here, if set
}

func (o Options) validate() error {
	if len(o.Ns) == 0 || o.Rounds < 1 {
		return fmt.Errorf("want at least one count and one round, got counts %v and %d rounds", o.Ns, o.Rounds)
	}
	for _, p := range o.Paths {
		if !slices.Contains(Paths, p) {
			return fmt.Errorf("path %q: want one of %v", p, Paths)
		}
	}
	for _, n := range slices.Concat(o.NetworkNs, o.OrdinaryNs, o.BaselineNs, o.PooledNs) {
		if !slices.Contains(o.Ns, n) {
			return fmt.Errorf("network, ordinary, pooled or baseline arm at n=%d: not among the counts %v", n, o.Ns)
		}
	}
	if len(o.PooledNs) > 0 && pooledSpares(o.PooledNs) > spare.MaxSpares {
		return fmt.Errorf("pooled arm at n=%d: a burst in pooled VMs has at most %d (shim.spares)", pooledSpares(o.PooledNs), spare.MaxSpares)
	}
	if o.Baseline == "" {
		return nil
	}
	if !slices.Contains(o.Paths, PathShim) || len(o.BaselineNs) == 0 {
		return fmt.Errorf("a baseline runs beside the shim path: want the shim path and baseline counts, got paths %v and counts %v", o.Paths, o.BaselineNs)
	}
	return checkBaseline(o.Baseline)
}

// Run runs every cell, writes the results and prints the tables to out.
func Run(ctx context.Context, out io.Writer, o Options) error {
	_, err := run(ctx, out, o)
	return err
}

func run(ctx context.Context, out io.Writer, o Options) (res *results, err error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	img, err := stackrun.EnsureImage(ctx, out, stackrun.ImageSpec{Guest: o.Guest, Cache: o.Cache, Memory: o.Memory, BinDir: o.BinDir})
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("/tmp", "cocoon-bench-")
	if err != nil {
		return nil, fmt.Errorf("create bench dir: %w", err)
	}
	defer os.RemoveAll(tmp)
	if res, err = newResults(ctx, img, o.Rounds); err != nil {
		return nil, err
	}
	if o.Baseline != "" {
		res.Baseline = o.BaselineLabel
		if res.Baseline == "" {
			res.Baseline = o.Baseline
		}
	}
	set, err := openArms(ctx, out, o, img, tmp, res.Snapshot.MemoryBytes>>10)
	defer func() { err = errors.Join(err, set.close()) }()
	if err != nil {
		return nil, err
	}
	for _, s := range set.stagers {
		fr, err := measureFirst(ctx, s)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(out, "%-6s first stage of a new chain %.0f ms (flatten), then %.1f ms cached\n", s.name, fr.FirstMs, fr.WarmMs)
		res.FirstRestore = append(res.FirstRestore, fr)
	}
	if set.shim != nil && len(o.ConvertPads) > 0 {
		if res.Conversions, err = measureConversions(ctx, out, set.shim, o.ConvertPads); err != nil {
			return nil, err
		}
	}
	if o.WholeRounds > 0 {
		if res.Whole, err = measureWhole(ctx, out, set.shim, tmp, o.WholeRounds); err != nil {
			return nil, err
		}
	}
	if o.PullRounds > 0 {
		if res.Pull, err = measureEmptyNode(ctx, out, o, img, tmp); err != nil {
			return nil, err
		}
	}
	runs, err := runCells(ctx, out, o, set.arms)
	if err != nil {
		return nil, err
	}
	pooled, costs, err := measurePooled(ctx, out, set.pooled, set.arms, o.PooledNs, o.Rounds)
	if err != nil {
		return nil, err
	}
	maps.Copy(runs, pooled)
	res.Load.End = loadAvg()
	res.fill(o.Ns, set.arms, runs)
	if len(o.PooledNs) > 0 {
		res.PooledSpares, res.PoolCosts = pooledSpares(o.PooledNs), costs
	}
	if err := writeResults(res, o.Out, o.Readme); err != nil {
		return nil, err
	}
	fmt.Fprintln(out)
	fmt.Fprint(out, res.markdown(""))
	return res, nil
}

// runCells runs every cell once per round: at each N the arms take turns,
// in reverse order every other round, so none always runs on a cache
// another just warmed.
func runCells(ctx context.Context, out io.Writer, o Options, arms []armAt) (map[cellKey][]cellRun, error) {
	runs := map[cellKey][]cellRun{}
	for round := range o.Rounds {
		order := slices.Clone(arms)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, n := range o.Ns {
			for _, a := range order {
				if a.own || !a.runsAt(n) {
					continue
				}
				run, err := runCell(ctx, a, n, round)
				if err != nil {
					return nil, err
				}
				k := cellKey{arm: a.id, n: n}
				runs[k] = append(runs[k], run)
				mem := meanMemory(run.mem)
				fmt.Fprintf(out, "round %d  n=%-2d %-18s p50 %8.1f ms  wall %8.1f ms  pss %5.1f  guest ram %5.1f MiB/clone\n",
					round+1, n, a.id, ms(percentile(run.ready, 0.5)), ms(run.wall), mem.pss, mem.guest)
				for _, err := range run.failed {
					fmt.Fprintf(out, "round %d  n=%-2d %-18s FAILED (left out of the samples): %v\n", round+1, n, a.id, err)
				}
			}
		}
	}
	return runs, nil
}

func newResults(ctx context.Context, img stackrun.SnapshotImage, rounds int) (*results, error) {
	link, err := chain.ReadLink(img.LinkDir)
	if err != nil {
		return nil, err
	}
	m, err := probeMachine(ctx)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(filepath.Join(img.LinkDir, chain.DataFile))
	if err != nil {
		return nil, fmt.Errorf("snapshot memory data: %w", err)
	}
	return &results{
		Date:     time.Now().UTC().Truncate(time.Second),
		Machine:  m,
		Snapshot: snapshotInfo{Ref: img.Ref, MemoryBytes: link.MemoryBytes, DataBytes: fi.Size()},
		Rounds:   rounds,
		Load:     loadInfo{Start: loadAvg()},
	}, nil
}

// fill summarises the runs per N in the order the arms are listed.
func (r *results) fill(ns []int, arms []armAt, runs map[cellKey][]cellRun) {
	for _, n := range ns {
		for _, a := range arms {
			if a.runsAt(n) {
				k := cellKey{arm: a.id, n: n}
				r.Cells = append(r.Cells, summarize(k, runs[k]))
			}
		}
	}
	r.fillRatios()
}
