// Command cocoon-bench runs cocoon for show and for measure, in a private
// containerd it starts and tears down: `demo` runs a container per restore
// mode and prints its restore report; `bench` measures fan-out restores
// against runc and a cold boot (see internal/bench); `soak` runs many
// restores with random kills and checks nothing leaked (see internal/soak).
// None belongs in the operator's CLI (cocoonctl).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/containerd/log"
)

// subcommands by name: each defines its flags on fs and returns what runs
// once they are parsed.
var subcommands = map[string]func(fs *flag.FlagSet) func(ctx context.Context) error{
	"bench": benchFlags,
	"demo":  demoFlags,
	"soak":  soakFlags,
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 || subcommands[args[0]] == nil {
		fmt.Fprintln(os.Stderr, "usage: cocoon-bench bench|demo|soak [flags]  (-h after a subcommand lists its flags)")
		return 2
	}
	fs := flag.NewFlagSet("cocoon-bench "+args[0], flag.ContinueOnError)
	do := subcommands[args[0]](fs)
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "cocoon-bench %s: unexpected arguments %q: it takes only flags\n", args[0], fs.Args())
		return 2
	}
	// Per-restore info lines would drown the output; warnings still show.
	if err := log.SetLevel("warn"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := do(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "cocoon-bench %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

// ownBinDir is the directory cocoon-bench runs from: make build puts every
// binary there.
func ownBinDir() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find bin dir: %w", err)
	}
	return filepath.Dir(exe), nil
}

// imageFlags are the flags both subcommands share: the guest, the snapshot
// image cache and the binaries.
type imageFlags struct {
	guest, cache, memory, binDir string
}

func (f *imageFlags) define(fs *flag.FlagSet) {
	fs.StringVar(&f.guest, "guest", "build/guest", "guest build `dir`ectory")
	fs.StringVar(&f.cache, "cache", "build/snapshots", "snapshot image cache `dir`ectory")
	fs.StringVar(&f.memory, "memory", "512M", "guest memory `size` of the snapshot")
	fs.StringVar(&f.binDir, "bin", "", "`dir`ectory with containerd, ctr, cocoon-snapshotter, the shims and cocoonctl (default: cocoon-bench's own)")
}

// bin is the bin dir flag, or cocoon-bench's own dir.
func (f *imageFlags) bin() (string, error) {
	if f.binDir != "" {
		return f.binDir, nil
	}
	return ownBinDir()
}
