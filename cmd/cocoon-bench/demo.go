package main

import (
	"context"
	"flag"
	"os"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/demo"
)

func demoFlags(fs *flag.FlagSet) func(ctx context.Context) error {
	var f imageFlags
	f.define(fs)
	keep := fs.Bool("keep", false, "leave containerd and the snapshotter running and print ctr commands to try")
	down := fs.String("down", "", "tear down a stack a --keep demo left in `dir` and exit")
	return func(ctx context.Context) error {
		if *down != "" {
			return demo.Down(*down)
		}
		bin, err := f.bin()
		if err != nil {
			return err
		}
		return demo.Run(ctx, os.Stdout, demo.Options{Guest: f.guest, Cache: f.cache, Memory: f.memory, BinDir: bin, Keep: *keep})
	}
}
