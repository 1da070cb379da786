// Command containerd-shim-cocoon-v2 is the binary containerd runs for
// cocoon's runtime (io.containerd.cocoon.v2): a small launcher. Its `start`,
// run for every task, puts the task in its shim socket and starts the task
// server behind it (package launch) in about a millisecond; the full server
// binary, cocoon-shim-server next to it, would take four just to start.
// Its `delete` answers for a task its server deleted cleanly (see
// launch.DeletedFile). Every other action (delete otherwise, -info, -v) is
// that server binary's, which this process becomes. Executed as
// hold.Argv0 it is a pod sandbox's pause process.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/launch"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/pause/hold"
)

// maxParams bounds the bootstrap parameters read from stdin, as pkg/shim does.
const maxParams = 10 << 20

func main() {
	if filepath.Base(os.Args[0]) == hold.Argv0 {
		hold.Main()
		return
	}
	server, err := serverPath()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cli, action := parseArgs(os.Args[1:])
	switch {
	case action == "start":
		if err := start(cli, server); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	case action == "delete":
		answered, err := answerDelete(cli.bundle)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if answered {
			return
		}
	}
	err = syscall.Exec(server, append([]string{server}, os.Args[1:]...), os.Environ())
	fmt.Fprintf(os.Stderr, "run %s: %v\n", server, err)
	os.Exit(1)
}

// cliFlags are pkg/shim's command line, the part `start` and `delete`
// check.
type cliFlags struct {
	namespace, id, address, bundle string
}

// parseArgs parses pkg/shim's flags and returns them and the action; ""
// when it cannot parse them, which leaves them to the server binary.
func parseArgs(args []string) (cliFlags, string) {
	var c cliFlags
	fs := flag.NewFlagSet("containerd-shim-cocoon-v2", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.namespace, "namespace", "", "")
	fs.StringVar(&c.id, "id", "", "")
	fs.StringVar(&c.address, "address", "", "")
	fs.StringVar(&c.bundle, "bundle", "", "")
	for _, name := range []string{"socket", "debug-socket", "publish-binary"} {
		fs.String(name, "", "")
	}
	for _, name := range []string{"debug", "v", "info"} {
		fs.Bool(name, false, "")
	}
	if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
		return c, ""
	}
	return c, fs.Arg(0)
}

// answerDelete prints the exit of a task its server deleted cleanly, as
// `shim delete` does, and reports whether it did: a task without that
// record (its server crashed, or never restored) is the server binary's
// to clean up.
func answerDelete(bundle string) (bool, error) {
	if bundle == "" {
		return false, nil
	}
	d, err := launch.ReadDeleted(bundle)
	if err != nil {
		return false, nil
	}
	if _, err := os.Stdout.Write(d.DeleteResponse()); err != nil {
		return false, fmt.Errorf("write delete response: %w", err)
	}
	return true, nil
}

// start reads containerd's bootstrap parameters, starts the task's server
// and prints the bootstrap result.
func start(cli cliFlags, server string) error {
	input, err := io.ReadAll(io.LimitReader(os.Stdin, maxParams))
	if err != nil {
		return fmt.Errorf("read bootstrap params: %w", err)
	}
	p, err := launch.DecodeParams(input)
	if err != nil {
		return err
	}
	if p.InstanceID != cli.id || p.Namespace != cli.namespace {
		return errors.New("bootstrap params do not match the command line's -id and -namespace")
	}
	if p.SocketDir != "" {
		if err := launch.LinkSocketDir(p.SocketDir); err != nil {
			return err
		}
	}
	addr, err := launch.Start(launch.Request{
		ID: p.InstanceID, Namespace: p.Namespace, Containerd: p.ContainerdGRPC,
		SocketDir: p.SocketDir, Debug: p.Debug(), Server: server,
	})
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(launch.EncodeResult(addr))
	return err
}

// serverPath is the server binary next to this one, symlinks resolved as
// the server's own os.Executable has them: spares are found by that path.
func serverPath() (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find launcher binary: %w", err)
	}
	server, err := filepath.EvalSymlinks(filepath.Join(filepath.Dir(self), launch.ServerName))
	if err != nil {
		return "", fmt.Errorf("find the task server binary next to the launcher: %w", err)
	}
	return server, nil
}
