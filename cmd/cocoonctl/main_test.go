package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The test binary re-executed with envMain set is cocoonctl itself, so
// tests can run commands as a user does: as a process that gets signals.
const (
	envMain  = "COCOONCTL_TEST_MAIN"
	envGrace = "COCOONCTL_TEST_STOP_GRACE"
)

func TestMain(m *testing.M) {
	if os.Getenv(envMain) != "" {
		if g, err := time.ParseDuration(os.Getenv(envGrace)); err == nil {
			stopGrace = g
		}
		os.Exit(run(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// Commands only tests register: they wait for a signal, one honouring its
// context and one stuck in a call that ignores it.
func init() {
	register(command{name: "test-wait", summary: "(test) wait for the context", flags: func(*flag.FlagSet) action {
		return func(ctx context.Context, _ env, _ []string) error {
			fmt.Println("ready")
			<-ctx.Done()
			return ctx.Err()
		}
	}})
	register(command{name: "test-stuck", summary: "(test) block ignoring the context", flags: func(*flag.FlagSet) action {
		return func(context.Context, env, []string) error {
			fmt.Println("ready")
			select {}
		}
	}})
}

// cocoonctl is one run of cocoonctl as a process.
type cocoonctl struct {
	cmd            *exec.Cmd
	stdout, stderr syncBuffer
	done           chan error
}

// syncBuffer is a bytes.Buffer a test may read while the process writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startCocoonctl starts cocoonctl with args; it is killed if still running
// when the test ends.
func startCocoonctl(t *testing.T, env []string, args ...string) *cocoonctl {
	t.Helper()
	c := &cocoonctl{cmd: exec.Command(os.Args[0], args...), done: make(chan error, 1)}
	c.cmd.Env = append(append(os.Environ(), envMain+"=1"), env...)
	c.cmd.Stdout, c.cmd.Stderr = &c.stdout, &c.stderr
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("start cocoonctl: %v", err)
	}
	go func() { c.done <- c.cmd.Wait() }()
	t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	})
	return c
}

// wait waits up to limit for cocoonctl to exit and returns its exit code.
func (c *cocoonctl) wait(t *testing.T, limit time.Duration) int {
	t.Helper()
	select {
	case err := <-c.done:
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatalf("wait for cocoonctl: %v", err)
		}
		return c.cmd.ProcessState.ExitCode()
	case <-time.After(limit):
		t.Fatalf("cocoonctl %s still runs after %v; stderr:\n%s", strings.Join(c.cmd.Args[1:], " "), limit, c.stderr.String())
	}
	return 0
}

// waitReady waits for a test command to print its ready line.
func (c *cocoonctl) waitReady(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if strings.Contains(c.stdout.String(), "ready") {
			return
		}
	}
	t.Fatalf("cocoonctl never got ready; stderr:\n%s", c.stderr.String())
}

// maxRSS is the peak resident memory of the exited process, in bytes.
func (c *cocoonctl) maxRSS() int64 {
	return c.cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss << 10
}

func TestSignalStopsCommand(t *testing.T) {
	tests := []struct {
		name     string
		command  string
		sig      syscall.Signal
		wantCode int
		wantErr  string
	}{
		{"SIGTERM cancels the context", "test-wait", syscall.SIGTERM, 1, "context canceled"},
		{"SIGINT cancels the context", "test-wait", syscall.SIGINT, 1, "context canceled"},
		{"SIGTERM ends a stuck command after the grace", "test-stuck", syscall.SIGTERM, 128 + int(syscall.SIGTERM), "did not stop within 200ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := startCocoonctl(t, []string{envGrace + "=200ms"}, tt.command)
			c.waitReady(t)
			if err := c.cmd.Process.Signal(tt.sig); err != nil {
				t.Fatal(err)
			}
			if code := c.wait(t, 20*time.Second); code != tt.wantCode || !strings.Contains(c.stderr.String(), tt.wantErr) {
				t.Fatalf("exit code %d, stderr %q; want %d and %q", code, c.stderr.String(), tt.wantCode, tt.wantErr)
			}
		})
	}
}

func TestSecondSignalKills(t *testing.T) {
	c := startCocoonctl(t, []string{envGrace + "=1h"}, "test-stuck")
	c.waitReady(t)
	// The first SIGTERM is handled; one sent after that kills.
	deadline := time.After(20 * time.Second)
	for exited := false; !exited; {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-c.done:
			c.done <- err
			exited = true
		case <-deadline:
			t.Fatal("cocoonctl survived repeated SIGTERMs for 20s")
		case <-time.After(50 * time.Millisecond):
		}
	}
	c.wait(t, time.Second)
	if ws := c.cmd.ProcessState.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Fatalf("after two SIGTERMs cocoonctl exited with %v, want killed by SIGTERM", ws)
	}
}
