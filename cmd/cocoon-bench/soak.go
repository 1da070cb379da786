package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/soak"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/stackrun"
)

func soakFlags(fs *flag.FlagSet) func(ctx context.Context) error {
	var f imageFlags
	f.define(fs)
	var o soak.Options
	fs.IntVar(&o.Restores, "n", 1000, "`restores` to run")
	fs.IntVar(&o.Parallel, "parallel", 8, "restores at a `time`")
	fs.Float64Var(&o.KillRate, "kill-rate", 0.1, "`share` of restores whose task, shim or QEMU is killed")
	fs.Float64Var(&o.OrdinaryShare, "ordinary", 0.25, "`share` of restores of an ordinary busybox image on the base snapshot (0: none)")
	fs.IntVar(&o.Pods, "pods", 50, "`pods` among the restores: a sandbox restoring the pod's VM and containers joining it, one killed and replaced (0: none)")
	fs.Float64Var(&o.HostileShare, "hostile", 0.05, "`share` of restores given a hostile input to refuse or take without harm (FIFO or nfs mounts, a FIFO as the network namespace, links out of a bind, an empty dir)")
	fs.IntVar(&o.Spares, "pooled", 0, "`spares` that wait, each with a VM restored ahead for the next task to claim (shim.pooled_vm; 0: off)")
	fs.Uint64Var(&o.Seed, "seed", 0, "`seed` of the plan (0: random)")
	fs.DurationVar(&o.SettleTimeout, "settle", 0, "how long the counts may take to come back after the last restore (default 2m)")
	fs.StringVar(&o.LogLevel, "log-level", "info", "`level` of containerd, the snapshotter and the shims")
	fs.StringVar(&o.Logs, "logs", "", "write the daemons' logs (the shims' included) to this `file` at the end")
	return func(ctx context.Context) error {
		var err error
		if o.BinDir, err = f.bin(); err != nil {
			return err
		}
		img, err := stackrun.EnsureImage(ctx, os.Stdout, stackrun.ImageSpec{Guest: f.guest, Cache: f.cache, Memory: f.memory, BinDir: o.BinDir})
		if err != nil {
			return err
		}
		o.Image = soak.Image{Ref: img.Ref, Archive: img.Archive}
		if o.Pods > 0 {
			pod, err := stackrun.EnsureImage(ctx, os.Stdout, stackrun.ImageSpec{Guest: f.guest, Cache: f.cache, Memory: f.memory, BinDir: o.BinDir, DiskSlots: soak.PodDiskSlots})
			if err != nil {
				return err
			}
			o.PodImage = soak.Image{Ref: pod.Ref, Archive: pod.Archive}
		}
		o.Progress = os.Stdout
		return runSoak(ctx, o)
	}
}

// runSoak runs the soak and prints its summary, then what failed or
// leaked; any of those fails the command.
func runSoak(ctx context.Context, o soak.Options) error {
	res, err := soak.Run(ctx, o)
	if err != nil {
		return err
	}
	fmt.Print("\n" + res.Markdown())
	if err := res.Err(); err != nil {
		fmt.Printf("\n%v\n", err)
		return errors.New("soak failed: see the failures and leftovers above")
	}
	fmt.Println("\nsoak: every count came back, no restore failed but the ones killed on purpose")
	return nil
}
