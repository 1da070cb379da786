package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

func init() {
	register(command{
		name:    "pack",
		summary: "write a chain as an OCI image archive (ctr images import)",
		flags:   packCommand(os.Stdout),
	})
}

func packCommand(out io.Writer) func(fs *flag.FlagSet) func(context.Context, []string) error {
	return func(fs *flag.FlagSet) func(context.Context, []string) error {
		var name, file string
		fs.StringVar(&name, "name", "", "image `reference`, e.g. example.com/snap/app:v1 (required)")
		fs.StringVar(&file, "out", "", "output archive `file`.tar (required); LINKDIR arguments are the chain, oldest first")
		return func(ctx context.Context, dirs []string) error {
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
			fmt.Fprintf(out, "%s: %s, %d layers\n", file, name, len(dirs))
			return nil
		}
	}
}

// writePack writes the archive to a temp file and renames it into place, so
// a failed pack leaves no partial archive.
func writePack(ctx context.Context, name string, dirs []string, file string) error {
	f, err := os.CreateTemp(filepath.Dir(file), ".tmp-"+filepath.Base(file)+"-*")
	if err != nil {
		return fmt.Errorf("create archive: %w", err)
	}
	err = chain.Pack(ctx, name, dirs, f)
	if err == nil {
		err = f.Chmod(0o644)
	}
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("write %s: %w", f.Name(), cerr)
	}
	if err == nil {
		err = os.Rename(f.Name(), file)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}
