// Command cocoon-snapshotter is cocoon's containerd proxy snapshotter: it
// serves the snapshots API on a unix socket for a containerd configured with
//
//	[proxy_plugins.cocoon]
//	  type = "snapshot"
//	  address = "/run/cocoon/snapshotter.sock"
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/containerd/log"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/snapshotter"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "cocoon-snapshotter: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("cocoon-snapshotter", flag.ContinueOnError)
	configPath := fs.String("config", "", "config file (default $"+config.EnvPath+", else "+config.DefaultPath+" if present)")
	root := fs.String("root", "", "state directory (overrides [snapshotter] root)")
	address := fs.String("address", "", "unix socket to serve on (overrides [snapshotter] address)")
	level := fs.String("log-level", "info", "log level: trace, debug, info, warn, error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q: all settings are flags", fs.Args())
	}
	if err := log.SetLevel(*level); err != nil {
		return fmt.Errorf("--log-level %q: %w", *level, err)
	}
	cfg, err := config.Load(*configPath)
	if err != nil {
		return err
	}
	sc := cfg.Snapshotter
	if *root != "" {
		sc.Root = *root
	}
	if *address != "" {
		sc.Address = *address
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx = log.WithLogger(ctx, log.G(ctx).WithField("component", "cocoon-snapshotter"))

	sn, err := snapshotter.New(ctx, sc.Root, snapshotter.WithFlatCacheSize(int64(sc.FlatCacheSize)), snapshotter.WithMaxRootfsSize(int64(sc.MaxRootfsSize)))
	if err != nil {
		return err
	}
	serveErr := snapshotter.Serve(ctx, sn, sc.Address)
	if err := sn.Close(); err != nil && serveErr == nil {
		serveErr = fmt.Errorf("close metadata: %w", err)
	}
	if serveErr == nil {
		log.G(ctx).Info("stopped")
	}
	return serveErr
}
