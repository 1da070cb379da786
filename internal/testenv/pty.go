package testenv

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/console"
)

// RunOnPty runs cmd with a pseudo-terminal as its stdin, stdout and stderr,
// as a user at a terminal would, and returns what the terminal showed and
// the exit code.
func RunOnPty(t testing.TB, cmd *exec.Cmd) (string, int) {
	t.Helper()
	master, slavePath, err := console.NewPty()
	if err != nil {
		t.Fatal(err)
	}
	defer master.Close()
	slave, err := os.OpenFile(slavePath, os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	if err := cmd.Start(); err != nil {
		slave.Close()
		t.Fatal(err)
	}
	slave.Close()
	output := make(chan string, 1)
	go func() {
		var b strings.Builder
		buf := make([]byte, 1024)
		for {
			n, err := master.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				output <- b.String()
				return
			}
		}
	}()
	err = cmd.Wait()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return <-output, 0
	case errors.As(err, &ee):
		return <-output, ee.ExitCode()
	}
	t.Fatalf("%s on a pty: %v", cmd.Path, err)
	return "", 0
}
