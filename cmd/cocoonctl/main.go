// Command cocoonctl is cocoon's operator CLI: it makes, packs, inspects and
// restores snapshot chains. Each subcommand lives in its own file and
// registers itself in init.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/drivers"
)

// command is one subcommand: flags binds its flags on fs and returns the
// action that runs once they are parsed.
type command struct {
	name    string
	summary string
	flags   func(fs *flag.FlagSet) action
}

// action runs a command with its flags parsed.
type action func(ctx context.Context, e env, args []string) error

// env is what a command takes from outside: its output streams and how it
// builds hypervisor drivers. Tests give their own.
type env struct {
	out, errOut io.Writer
	newDriver   func(config.Config) (hypervisor.Driver, error)
}

var commands = map[string]command{}

func register(c command) { commands[c.name] = c }

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage()
		return 2
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(os.Stderr, "cocoonctl: unknown command %q\n", args[0])
		usage()
		return 2
	}
	fs := flag.NewFlagSet("cocoonctl "+c.name, flag.ContinueOnError)
	do := c.flags(fs)
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer cancelOnSignal(cancel)()
	if err := do(ctx, env{out: os.Stdout, errOut: os.Stderr, newDriver: drivers.New}, fs.Args()); err != nil {
		fmt.Fprintf(os.Stderr, "cocoonctl %s: %v\n", c.name, err)
		return 1
	}
	return 0
}

// stopGrace is how long a command may take to return once SIGINT or
// SIGTERM cancelled its context (to stop what it started) before cocoonctl
// exits anyway: a command stuck in a call that ignores its context must
// not make the signal useless.
var stopGrace = 10 * time.Second

// cancelOnSignal cancels the command's context on the first SIGINT or
// SIGTERM, restores their default action so that a second one kills at
// once, and exits stopGrace later if the command has not returned. The
// returned func, called when the command returns, ends the watch.
func cancelOnSignal(cancel context.CancelFunc) (stop func()) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case <-done:
			return
		case sig := <-sigs:
			signal.Reset(os.Interrupt, syscall.SIGTERM)
			cancel()
			select {
			case <-done:
			case <-time.After(stopGrace):
				fmt.Fprintf(os.Stderr, "cocoonctl: %v: the command did not stop within %v\n", sig, stopGrace)
				os.Exit(128 + int(sig.(syscall.Signal)))
			}
		}
	}()
	return func() {
		signal.Stop(sigs)
		close(done)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: cocoonctl COMMAND [flags] [args]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-10s %s\n", n, commands[n].summary)
	}
}
