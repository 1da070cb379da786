package main

import (
	"context"
	"errors"
	"flag"
	"fmt"

	"github.com/containerd/containerd/v2/pkg/atomicfile"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

func init() {
	register(command{
		name:    "pack",
		summary: "write a chain as an OCI image archive (ctr images import)",
		flags:   packFlags,
	})
}

func packFlags(fs *flag.FlagSet) action {
	var name, file string
	fs.StringVar(&name, "name", "", "image `reference`, e.g. example.com/snap/app:v1 (required)")
	fs.StringVar(&file, "out", "", "output archive `file`.tar (required); LINKDIR arguments are the chain, oldest first")
	return func(ctx context.Context, e env, dirs []string) error {
		switch {
		case name == "":
			return errors.New("--name is required")
		case file == "":
			return errors.New("--out is required")
		case len(dirs) == 0:
			return errors.New("no link directories given: want LINKDIR... oldest first")
		}
		if err := writePack(ctx, name, dirs, file); err != nil {
			return err
		}
		fmt.Fprintf(e.out, "%s: %s, %d layers\n", file, name, len(dirs))
		return nil
	}
}

// writePack writes the archive through a temp file renamed into place, so
// a failed pack (or bake) leaves no partial archive.
func writePack(ctx context.Context, name string, dirs []string, file string) error {
	f, err := atomicfile.New(file, 0o644)
	if err != nil {
		return fmt.Errorf("create archive: %w", err)
	}
	if err := chain.Pack(ctx, name, dirs, f); err != nil {
		f.Cancel()
		return fmt.Errorf("pack archive: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write archive: %w", err)
	}
	return nil
}
