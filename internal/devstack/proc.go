package devstack

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// serveTimeout bounds how long a daemon may take to serve its socket.
const serveTimeout = 30 * time.Second

// proc is one daemon the stack started.
type proc struct {
	name string
	wrap []string // a command that runs bin/name, such as nsenter
	env  []string // added to this process's environment
	args []string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// spawn starts bin/name, through wrap if given (its args end with "--"),
// and adds it to the stack's daemons.
func (s *Stack) spawn(name string, wrap, env []string, args ...string) (*proc, error) {
	p := &proc{name: name, wrap: wrap, env: env, args: args, log: filepath.Join(s.Dir, name+".log")}
	if err := s.run(p); err != nil {
		return nil, err
	}
	s.procs = append(s.procs, p)
	return p, nil
}

// run starts p with its output appended to its log file under Dir. The
// daemons get their own process group so a terminal's ^C reaches only the
// caller, which then tears the stack down in order.
func (s *Stack) run(p *proc) error {
	f, err := os.OpenFile(p.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open %s log: %w", p.name, err)
	}
	defer f.Close()
	argv := append(append(slices.Clone(p.wrap), filepath.Join(s.BinDir, p.name)), p.args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), p.env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	p.cmd, p.done = cmd, done
	return nil
}

// waitSocket waits until daemon p listens on path.
func (s *Stack) waitSocket(ctx context.Context, p *proc, path string) error {
	ctx, cancel := context.WithTimeout(ctx, serveTimeout)
	defer cancel()
	for {
		if fi, err := os.Stat(path); err == nil && fi.Mode().Type() == os.ModeSocket {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before serving %s:\n%s", p.name, path, s.Logs())
		case <-ctx.Done():
			return fmt.Errorf("%s did not serve %s: %w:\n%s", p.name, path, ctx.Err(), s.Logs())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// CtrArgs is the ctr command line that talks to this containerd in
// Namespace, without the subcommand: for running ctr by hand.
func (s *Stack) CtrArgs() []string {
	return []string{filepath.Join(s.BinDir, "ctr"), "--address", s.Address, "--namespace", s.Namespace}
}

// Ctr runs ctr against this containerd in Namespace and returns its
// stdout; the error carries stderr.
func (s *Stack) Ctr(ctx context.Context, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	base := s.CtrArgs()
	cmd := exec.CommandContext(ctx, base[0], append(base[1:], args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// Logs returns what containerd and the snapshotter have logged so far,
// less containerd's line per plugin it loads or skips at every start (a
// hundred lines that would crowd out, in a failed test's output, the few
// that say what went wrong).
func (s *Stack) Logs() string {
	var b strings.Builder
	for _, p := range s.procs {
		data, _ := os.ReadFile(p.log)
		fmt.Fprintf(&b, "==== %s ====\n", p.name)
		for line := range strings.Lines(string(data)) {
			if !pluginChatter(line) {
				b.WriteString(line)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// pluginChatter reports whether line is containerd's note of a plugin it
// loads or skips.
func pluginChatter(line string) bool {
	return strings.Contains(line, `msg="loading plugin"`) || strings.Contains(line, `msg="skip loading plugin"`)
}
