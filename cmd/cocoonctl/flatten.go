package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

func init() {
	register(command{
		name:    "flatten",
		summary: "write a chain's memory as one sparse file",
		flags:   flattenCommand(os.Stdout),
	})
}

func flattenCommand(out io.Writer) func(fs *flag.FlagSet) func(context.Context, []string) error {
	return func(fs *flag.FlagSet) func(context.Context, []string) error {
		var file string
		fs.StringVar(&file, "out", "", "output memory `file` (required); LINKDIR arguments are the chain, oldest first")
		return func(ctx context.Context, dirs []string) error {
			if file == "" {
				return errors.New("--out is required")
			}
			if len(dirs) == 0 {
				return errors.New("no link directories given: want LINKDIR... oldest first")
			}
			if err := chain.Flatten(ctx, dirs, file); err != nil {
				return err
			}
			fmt.Fprintf(out, "%s: %d links flattened\n", file, len(dirs))
			return nil
		}
	}
}
