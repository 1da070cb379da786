package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/log"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// bench measures fan-out restores of one snapshot: N clones at once, in
// each mode, through containerd and the shim and directly through the
// driver, the two paths interleaved in one run.
func init() {
	register(command{
		name:    "bench",
		summary: "measure N concurrent restores, copy vs mmap, through containerd vs direct",
		flags:   benchCommand(os.Stdout),
	})
}

var benchPaths = []string{"direct", "shim"}

type benchOptions struct {
	ns             []int
	modes          []hypervisor.Mode
	paths          []string
	rounds         int
	guest, cache   string
	memory, binDir string
	out, readme    string
}

func benchCommand(out io.Writer) func(fs *flag.FlagSet) func(context.Context, []string) error {
	return func(fs *flag.FlagSet) func(context.Context, []string) error {
		var o benchOptions
		var ns, modes, paths string
		fs.StringVar(&ns, "n", "1,8,16", "comma-separated `counts` of concurrent restores")
		fs.StringVar(&modes, "modes", "copy,mmap", "comma-separated restore `modes`")
		fs.StringVar(&paths, "paths", "direct,shim", "comma-separated `paths`: direct (restore.Run, no containerd), shim (containerd + the cocoon shim)")
		fs.IntVar(&o.rounds, "rounds", 5, "times each cell runs; samples are pooled")
		fs.StringVar(&o.guest, "guest", "build/guest", "guest build `dir`ectory")
		fs.StringVar(&o.cache, "cache", "build/snapshots", "snapshot image cache `dir`ectory")
		fs.StringVar(&o.memory, "memory", "512M", "guest memory `size` of the snapshot")
		fs.StringVar(&o.binDir, "bin", "", "`dir`ectory with containerd, ctr, cocoon-snapshotter and the shim (default: cocoonctl's own)")
		fs.StringVar(&o.out, "out", "bench/results", "results `dir`ectory: <date>.json, .md and .svg")
		fs.StringVar(&o.readme, "readme", "", "also write the latest table and chart to this markdown `file`")
		return func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("unexpected arguments %q: bench takes only flags", args)
			}
			var err error
			if o.ns, err = parseCounts(ns); err != nil {
				return err
			}
			if o.modes, err = parseModes(modes); err != nil {
				return err
			}
			if o.paths, err = parsePaths(paths); err != nil {
				return err
			}
			if o.rounds < 1 {
				return fmt.Errorf("--rounds %d: want at least 1", o.rounds)
			}
			if o.binDir == "" {
				if o.binDir, err = ownBinDir(); err != nil {
					return err
				}
			}
			// Per-restore info lines would drown the table; warnings still show.
			if err := log.SetLevel("warn"); err != nil {
				return err
			}
			_, err = runBench(ctx, out, o)
			return err
		}
	}
}

func parseCounts(s string) ([]int, error) {
	var ns []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("--n %q: want comma-separated positive counts such as 1,8,16", s)
		}
		ns = append(ns, n)
	}
	return ns, nil
}

func parseModes(s string) ([]hypervisor.Mode, error) {
	var ms []hypervisor.Mode
	for _, f := range strings.Split(s, ",") {
		m, err := hypervisor.ParseMode(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("--modes: %w", err)
		}
		ms = append(ms, m)
	}
	return ms, nil
}

func parsePaths(s string) ([]string, error) {
	var ps []string
	for _, f := range strings.Split(s, ",") {
		p := strings.TrimSpace(f)
		if !slices.Contains(benchPaths, p) {
			return nil, fmt.Errorf("--paths %q: want a comma-separated list of %s", s, strings.Join(benchPaths, ", "))
		}
		ps = append(ps, p)
	}
	return ps, nil
}

// ownBinDir is the directory cocoonctl runs from: make build puts every
// binary there.
func ownBinDir() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find bin dir: %w", err)
	}
	return filepath.Dir(exe), nil
}

// runBench runs every cell, writes the results and returns them.
func runBench(ctx context.Context, out io.Writer, o benchOptions) (res *benchResults, err error) {
	img, err := ensureImage(ctx, out, imageSpec{guest: o.guest, cache: o.cache, memory: o.memory})
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("/tmp", "cocoon-bench-")
	if err != nil {
		return nil, fmt.Errorf("create bench dir: %w", err)
	}
	defer os.RemoveAll(tmp)
	paths, err := openPaths(ctx, o, img, tmp)
	defer func() { err = errors.Join(err, closePaths(paths)) }()
	if err != nil {
		return nil, err
	}
	res, err = newResults(ctx, img, o.rounds)
	if err != nil {
		return nil, err
	}
	for _, p := range paths {
		fr, err := measureFirst(ctx, p)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(out, "%-6s first stage of a new chain %.0f ms (flatten), then %.1f ms cached\n", p.name(), fr.FirstMs, fr.WarmMs)
		res.FirstRestore = append(res.FirstRestore, fr)
	}
	runs, err := runCells(ctx, out, o, paths, res.Snapshot.MemoryBytes>>10)
	if err != nil {
		return nil, err
	}
	res.fill(o, paths, runs)
	if err := writeResults(res, o.out, o.readme); err != nil {
		return nil, err
	}
	fmt.Fprintln(out)
	fmt.Fprint(out, res.markdown(""))
	return res, nil
}

func openPaths(ctx context.Context, o benchOptions, img snapshotImage, tmp string) ([]restorePath, error) {
	var paths []restorePath
	for _, name := range o.paths {
		var (
			p   restorePath
			err error
		)
		switch name {
		case "direct":
			p, err = newDirectPath(ctx, img, filepath.Join(tmp, "d"))
		case "shim":
			p, err = newShimPath(ctx, o.binDir, img)
		}
		if err != nil {
			return paths, fmt.Errorf("set up %s path: %w", name, err)
		}
		paths = append(paths, p)
	}
	return paths, nil
}

func closePaths(paths []restorePath) error {
	var errs []error
	for _, p := range paths {
		errs = append(errs, p.close())
	}
	return errors.Join(errs...)
}

// measureFirst stages the chain on p twice: the first flattens it.
func measureFirst(ctx context.Context, p restorePath) (firstRestore, error) {
	first, err := p.stage(ctx)
	if err != nil {
		return firstRestore{}, fmt.Errorf("%s: %w", p.name(), err)
	}
	warm, err := p.stage(ctx)
	if err != nil {
		return firstRestore{}, fmt.Errorf("%s: %w", p.name(), err)
	}
	return firstRestore{Path: p.name(), FirstMs: ms(first), WarmMs: ms(warm)}, nil
}

// runCells runs every (N, mode, path) cell once per round. The paths take
// turns within each (N, mode), in reverse order every other round, so
// neither always runs on a cache the other just warmed.
func runCells(ctx context.Context, out io.Writer, o benchOptions, paths []restorePath, guestKiB int64) (map[cellKey][]cellRun, error) {
	runs := map[cellKey][]cellRun{}
	for round := range o.rounds {
		order := slices.Clone(paths)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, n := range o.ns {
			for _, mode := range o.modes {
				for _, p := range order {
					run, err := runCell(ctx, p, n, round, mode, guestKiB)
					if err != nil {
						return nil, err
					}
					k := cellKey{path: p.name(), mode: string(mode), n: n}
					runs[k] = append(runs[k], run)
					mem := meanMemory(run.mem)
					fmt.Fprintf(out, "round %d  n=%-2d %-4s %-6s p50 %7.1f ms  wall %7.1f ms  pss %5.1f  guest ram %5.1f MiB/clone\n",
						round+1, n, mode, p.name(), ms(percentile(run.ready, 0.5)), ms(run.wall), mem.pss, mem.guest)
				}
			}
		}
	}
	return runs, nil
}

func newResults(ctx context.Context, img snapshotImage, rounds int) (*benchResults, error) {
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
	return &benchResults{
		Date:     time.Now().UTC().Truncate(time.Second),
		Machine:  m,
		Snapshot: snapshotInfo{Ref: img.Ref, MemoryBytes: link.MemoryBytes, DataBytes: fi.Size()},
		Rounds:   rounds,
	}, nil
}

// fill summarises the runs in the order the options list the cells.
func (r *benchResults) fill(o benchOptions, paths []restorePath, runs map[cellKey][]cellRun) {
	for _, n := range o.ns {
		for _, mode := range o.modes {
			for _, p := range paths {
				k := cellKey{path: p.name(), mode: string(mode), n: n}
				r.Cells = append(r.Cells, summarize(k, runs[k]))
			}
		}
	}
	r.ModeRatios, r.PathRatios = ratios(r.Cells)
}
