package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/containerd/log"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/soak"
)

func init() {
	register(command{
		name:    "soak",
		summary: "restore many VMs through containerd with random kills and check nothing leaked",
		flags:   soakCommand(os.Stdout),
	})
}

type soakFlags struct {
	opts                 soak.Options
	guest, cache, memory string
}

func soakCommand(out io.Writer) func(fs *flag.FlagSet) func(context.Context, []string) error {
	return func(fs *flag.FlagSet) func(context.Context, []string) error {
		var f soakFlags
		fs.IntVar(&f.opts.Restores, "n", 1000, "`restores` to run")
		fs.IntVar(&f.opts.Parallel, "parallel", 8, "restores at a `time`")
		fs.Float64Var(&f.opts.KillRate, "kill-rate", 0.1, "`share` of restores whose task, shim or QEMU is killed")
		fs.Float64Var(&f.opts.OrdinaryShare, "ordinary", 0.25, "`share` of restores of an ordinary busybox image on the base snapshot (0: none)")
		fs.Uint64Var(&f.opts.Seed, "seed", 0, "`seed` of the plan (0: random)")
		fs.DurationVar(&f.opts.SettleTimeout, "settle", 0, "how long the counts may take to come back after the last restore (default 2m)")
		fs.StringVar(&f.guest, "guest", "build/guest", "guest build `dir`ectory")
		fs.StringVar(&f.cache, "cache", "build/snapshots", "snapshot image cache `dir`ectory")
		fs.StringVar(&f.memory, "memory", "256M", "guest memory `size` of the snapshot")
		fs.StringVar(&f.opts.LogLevel, "log-level", "info", "`level` of containerd, the snapshotter and the shims")
		fs.StringVar(&f.opts.Logs, "logs", "", "write the daemons' logs (the shims' included) to this `file` at the end")
		fs.StringVar(&f.opts.BinDir, "bin", "", "`dir`ectory with containerd, ctr, cocoon-snapshotter and the shim (default: cocoonctl's own)")
		return func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("unexpected arguments %q: soak takes only flags", args)
			}
			if f.opts.BinDir == "" {
				var err error
				if f.opts.BinDir, err = ownBinDir(); err != nil {
					return err
				}
			}
			if err := log.SetLevel("warn"); err != nil {
				return err
			}
			return runSoak(ctx, out, f)
		}
	}
}

// runSoak bakes (or reuses) the snapshot image, runs the soak and prints
// its summary, then what failed or leaked; any of those fails the command.
func runSoak(ctx context.Context, out io.Writer, f soakFlags) error {
	img, err := ensureImage(ctx, out, imageSpec{guest: f.guest, cache: f.cache, memory: f.memory})
	if err != nil {
		return err
	}
	f.opts.Image = soak.Image{Ref: img.Ref, Archive: img.Archive}
	f.opts.Progress = out
	res, err := soak.Run(ctx, f.opts)
	if err != nil {
		return err
	}
	fmt.Fprintln(out)
	fmt.Fprint(out, res.Markdown())
	if err := res.Err(); err != nil {
		fmt.Fprintf(out, "\n%v\n", err)
		return errors.New("soak failed: see the failures and leftovers above")
	}
	fmt.Fprintln(out, "\nsoak: every count came back, no restore failed but the ones killed on purpose")
	return nil
}
