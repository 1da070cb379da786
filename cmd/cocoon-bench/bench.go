package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/docker/go-units"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/bench"
)

func benchFlags(fs *flag.FlagSet) func(ctx context.Context) error {
	var f imageFlags
	f.define(fs)
	var o bench.Options
	ns := fs.String("n", "1,8,16", "comma-separated `counts` of containers started at once")
	modes := fs.String("modes", "copy,mmap", "comma-separated restore `modes` of the direct and shim paths")
	paths := fs.String("paths", strings.Join(bench.Paths, ","), "comma-separated `paths`: direct (restore.Run, no containerd), shim (containerd + the cocoon shim), runc (containerd + runc, a busybox image), cold (a cold boot of the guest)")
	network := fs.String("network", "1,8", "comma-separated `counts` at which shim mmap also runs with a network namespace per container; empty: off")
	ordinary := fs.String("ordinary", "1,8", "comma-separated `counts` at which shim mmap also runs an ordinary busybox image; empty: off")
	pooled := fs.String("pooled", "1,8,16", "comma-separated `counts` at which shim mmap also starts in pooled VMs (shim.pooled_vm, 16 spares), runc beside it, a set of its own; empty: off")
	convert := fs.String("convert", "0,16M,64M,256M", "comma-separated `sizes` of random data added to a busybox image whose first use (erofs build) is measured; empty: off")
	baselineNs := fs.String("baseline-n", "1,8", "comma-separated `counts` at which the baseline's shim path runs")
	fs.StringVar(&o.Baseline, "baseline", "", "`dir`ectory of another build's tree (make build guest there) whose shim path also runs, side by side, in every mode; empty: off")
	fs.StringVar(&o.BaselineLabel, "baseline-label", "", "what the baseline is, for the results (default its directory)")
	fs.IntVar(&o.Rounds, "rounds", 5, "times each cell runs; samples are pooled")
	fs.IntVar(&o.WholeRounds, "whole-rounds", 15, "times each arm of the whole start (ctr run --rm IMAGE ID echo hi, timed as a process: cocoon's two image kinds, runc, gVisor) runs; 0: off")
	fs.IntVar(&o.PullRounds, "pull-rounds", 3, "times each arm of the empty node (ctr image pull of the snapshot image from a registry on 127.0.0.1 into a new containerd, with the cocoon snapshotter then its first run, and with overlayfs) runs; 0: off")
	fs.StringVar(&o.Out, "out", "bench/results", "results `dir`ectory: <date>.json, .md and .svg")
	fs.StringVar(&o.Readme, "readme", "", "also write the latest tables and chart to this markdown `file`")
	return func(ctx context.Context) error {
		var err error
		if o.Ns, err = parseCounts("n", *ns, false); err != nil {
			return err
		}
		if o.NetworkNs, err = parseCounts("network", *network, true); err != nil {
			return err
		}
		if o.OrdinaryNs, err = parseCounts("ordinary", *ordinary, true); err != nil {
			return err
		}
		if o.PooledNs, err = parseCounts("pooled", *pooled, true); err != nil {
			return err
		}
		if o.Baseline != "" {
			if o.BaselineNs, err = parseCounts("baseline-n", *baselineNs, false); err != nil {
				return err
			}
		}
		if o.Modes, err = parseModes(*modes); err != nil {
			return err
		}
		if o.Paths, err = parsePaths(*paths); err != nil {
			return err
		}
		if o.ConvertPads, err = parseSizes(*convert); err != nil {
			return err
		}
		if o.BinDir, err = f.bin(); err != nil {
			return err
		}
		o.Guest, o.Cache, o.Memory = f.guest, f.cache, f.memory
		return bench.Run(ctx, os.Stdout, o)
	}
}

// fields splits a comma-separated flag value; empty is no fields.
func fields(s string) []string {
	if strings.TrimSpace(s) == "" {
		return nil
	}
	fs := strings.Split(s, ",")
	for i := range fs {
		fs[i] = strings.TrimSpace(fs[i])
	}
	return fs
}

func parseCounts(flag, s string, emptyOK bool) ([]int, error) {
	var ns []int
	for _, f := range fields(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("--%s %q: want comma-separated positive counts such as 1,8,16", flag, s)
		}
		ns = append(ns, n)
	}
	if len(ns) == 0 && !emptyOK {
		return nil, fmt.Errorf("--%s: want at least one count", flag)
	}
	return ns, nil
}

func parseModes(s string) ([]hypervisor.Mode, error) {
	var ms []hypervisor.Mode
	for _, f := range fields(s) {
		m, err := hypervisor.ParseMode(f, false)
		if err != nil {
			return nil, fmt.Errorf("--modes: %w", err)
		}
		ms = append(ms, m)
	}
	return ms, nil
}

func parsePaths(s string) ([]string, error) {
	ps := fields(s)
	for _, p := range ps {
		if !slices.Contains(bench.Paths, p) {
			return nil, fmt.Errorf("--paths %q: want a comma-separated list of %s", s, strings.Join(bench.Paths, ", "))
		}
	}
	return ps, nil
}

func parseSizes(s string) ([]int64, error) {
	var sizes []int64
	for _, f := range fields(s) {
		n, err := units.RAMInBytes(f)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("--convert %q: want comma-separated sizes such as 0,16M,64M", s)
		}
		sizes = append(sizes, n)
	}
	return sizes, nil
}
