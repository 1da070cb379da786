package main

import (
	"context"
	"errors"
	"flag"
	"fmt"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

func init() {
	register(command{
		name:    "flatten",
		summary: "write a chain's memory as one sparse file",
		flags:   flattenFlags,
	})
}

func flattenFlags(fs *flag.FlagSet) action {
	var file string
	fs.StringVar(&file, "out", "", "output memory `file` (required); LINKDIR arguments are the chain, oldest first")
	return func(ctx context.Context, e env, dirs []string) error {
		if file == "" {
			return errors.New("--out is required")
		}
		if len(dirs) == 0 {
			return errors.New("no link directories given: want LINKDIR... oldest first")
		}
		if err := chain.Flatten(ctx, dirs, file); err != nil {
			return err
		}
		fmt.Fprintf(e.out, "%s: %d links flattened\n", file, len(dirs))
		return nil
	}
}
