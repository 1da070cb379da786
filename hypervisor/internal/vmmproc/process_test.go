package vmmproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/drivertest"
)

// envServe makes the re-executed test binary a VMM that serves its API
// socket (the value) until it is killed.
const envServe = "VMMPROC_TEST_SERVE"

// envExit, with envServe, makes that VMM exit with the status it names
// once its first connection has been accepted, instead of running on.
const envExit = "VMMPROC_TEST_EXIT"

func TestMain(m *testing.M) {
	if sock := os.Getenv(envServe); sock != "" {
		serve(sock, os.Getenv(envExit))
	}
	os.Exit(m.Run())
}

func serve(sock, exit string) {
	ln, err := net.Listen("unix", sock)
	if err != nil {
		os.Exit(1)
	}
	if exit == "" {
		select {}
	}
	code, err := strconv.Atoi(exit)
	if err != nil {
		os.Exit(1)
	}
	if c, err := ln.Accept(); err == nil {
		c.Close()
	}
	ln.Close()
	os.Exit(code)
}

// script writes an executable shell script running body.
func script(t *testing.T, body string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "vmm")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// serving is a Spec of a VMM that serves its socket in dir.
func serving(t *testing.T, dir string) Spec {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "api.sock")
	return Spec{Binary: script(t, "export "+envServe+"="+sock+"\nexec "+self), Log: "vmm.log", Socket: sock}
}

// exiting is a Spec of a VMM that serves its socket in dir until Start
// has connected, then exits with status code.
func exiting(t *testing.T, dir string, code int) Spec {
	t.Helper()
	s := serving(t, dir)
	s.Binary = script(t, fmt.Sprintf("export %s=%d\nexec %s", envExit, code, s.Binary))
	return s
}

func gone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

func TestStartKillWait(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	p, err := Start(ctx, dir, serving(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop() })
	if sid, err := unix.Getsid(p.PID()); err != nil || sid != p.PID() {
		t.Errorf("session of pid %d = %d, %v: want its own", p.PID(), sid, err)
	}
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if err := p.Wait(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("wait on a running vmm: err = %v, want deadline exceeded", err)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := p.Wait(ctx); err == nil || !strings.Contains(err.Error(), "signal: killed") {
			t.Fatalf("wait after kill: err = %v, want the kill reported", err)
		}
		if err := p.Reaped(ctx); err != nil {
			t.Fatalf("reaped after kill: %v", err)
		}
	}
	if err := p.Kill(); err != nil {
		t.Errorf("kill of a reaped vmm: %v", err)
	}
	if !gone(p.PID()) {
		t.Errorf("pid %d not reaped", p.PID())
	}
}

// TestWaitExitStatus checks that every Wait reports how the VMM exited:
// a crashed VMM must not look like a clean exit.
func TestWaitExitStatus(t *testing.T) {
	tests := []struct {
		name string
		code int
		want string
	}{
		{"clean exit", 0, ""},
		{"crash", 3, "exit status 3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			dir := t.TempDir()
			p, err := Start(ctx, dir, exiting(t, dir, tt.code))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Stop() })
			for range 2 {
				err := p.Wait(ctx)
				if tt.want == "" && err != nil {
					t.Fatalf("wait: %v, want nil", err)
				}
				if tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
					t.Fatalf("wait: err = %v, want one containing %q", err, tt.want)
				}
				if err := p.Reaped(ctx); err != nil {
					t.Fatalf("reaped: %v", err)
				}
			}
			// An ended context asks without waiting: the exit wins.
			ended, end := context.WithCancel(ctx)
			end()
			for range 20 {
				if err := p.Reaped(ended); err != nil {
					t.Fatalf("reaped with an ended context after the exit: %v, want nil", err)
				}
			}
		})
	}
}

func TestStartFailures(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	// Only the VMM that never serves waits for the context: give it a
	// short one, and the others one they never need.
	tests := []struct {
		name    string
		spec    Spec
		timeout time.Duration
		want    string
	}{
		{"exits at once", Spec{Binary: script(t, "exit 3"), Socket: "api.sock"}, time.Minute, "exited before serving its API: exit status 3"},
		{"never serves", Spec{Binary: script(t, "echo $$ > "+pidFile+"\nexec sleep 30"), Socket: "api.sock"}, time.Second, "wait for api socket"},
		{"no binary", Spec{Binary: "/nonexistent/vmm", Socket: "api.sock"}, time.Minute, "start /nonexistent/vmm"},
		{"socket path too long", Spec{Binary: "/bin/true", Socket: "/" + strings.Repeat("s", MaxSockPath)}, time.Minute, "unix sockets allow 107"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), tt.timeout)
			defer cancel()
			dir := t.TempDir()
			tt.spec.Log = "vmm.log"
			if !strings.HasPrefix(tt.spec.Socket, "/") {
				tt.spec.Socket = filepath.Join(dir, tt.spec.Socket)
			}
			startFails(t, ctx, dir, tt.spec, tt.want)
		})
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("never-serving vmm did not run: %v", err)
	}
	var pid int
	if _, err := fmt.Sscan(strings.TrimSpace(string(b)), &pid); err != nil || !gone(pid) {
		t.Errorf("never-serving vmm pid %s left running (%v)", b, err)
	}
}

// startFails wants Start to fail with an error containing want; a VMM
// that started after all is stopped, not left running detached.
func startFails(t *testing.T, ctx context.Context, dir string, s Spec, want string) {
	t.Helper()
	p, err := Start(ctx, dir, s)
	if err == nil {
		p.Stop()
		t.Fatalf("start succeeded, want an error containing %q", want)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v, want one containing %q", err, want)
	}
}

func TestInstanceClose(t *testing.T) {
	run := filepath.Join(t.TempDir(), "a", "run")
	inst, err := NewInstance(run)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewInstance(run); err == nil {
		t.Error("second instance in the same run dir: want an error")
	}
	if err := inst.Start(context.Background(), serving(t, run)); err != nil {
		t.Fatal(err)
	}
	pid := inst.PID()
	released := 0
	if err := inst.CloseWith(func() error { released++; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := inst.Close(); err != nil || released != 1 {
		t.Errorf("second close: %v, release ran %d times: want nil, once", err, released)
	}
	if !gone(pid) {
		t.Errorf("pid %d left running", pid)
	}
	if _, err := os.Stat(run); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("run dir left behind: %v", err)
	}
}

func TestMakeRunDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "parent", "run")
	if err := MakeRunDir(dir); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("run dir %v, %v: want mode 0700", fi, err)
	}
	for _, bad := range []string{dir, ""} {
		if err := MakeRunDir(bad); err == nil {
			t.Errorf("run dir %q: want an error", bad)
		}
	}
}

func TestCloseNeverStarted(t *testing.T) {
	run := filepath.Join(t.TempDir(), "run")
	inst, err := NewInstance(run)
	if err != nil {
		t.Fatal(err)
	}
	if err := inst.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(run); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("run dir left behind: %v", err)
	}
}

// TestStartNetNS: a VMM is born in the network namespace it is given, or
// in a new one of its own.
func TestStartNetNS(t *testing.T) {
	n := drivertest.NewNet(t)
	ours := drivertest.NetNSOf(t, os.Getpid())
	tests := []struct {
		name string
		spec func(*Spec)
		want func(got uint64) bool
	}{
		{"given", func(s *Spec) { s.NetNS = n.NS }, func(got uint64) bool { return got == drivertest.NSInode(t, n.NS) }},
		{"its own", func(s *Spec) { s.OwnNetNS = true }, func(got uint64) bool { return got != ours && got != drivertest.NSInode(t, n.NS) }},
		{"ours", func(*Spec) {}, func(got uint64) bool { return got == ours }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			s := serving(t, dir)
			tt.spec(&s)
			p, err := Start(context.Background(), dir, s)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Stop() })
			if got := drivertest.NetNSOf(t, p.PID()); !tt.want(got) {
				t.Errorf("vmm in network namespace %d (ours %d)", got, ours)
			}
		})
	}
	s := serving(t, t.TempDir())
	s.NetNS, s.OwnNetNS = n.NS, true
	startFails(t, context.Background(), t.TempDir(), s, "both")
	t.Run("attached, given", func(t *testing.T) {
		dir := t.TempDir()
		s := serving(t, dir)
		s.NetNS, s.Attached = n.NS, true
		p, err := Start(context.Background(), dir, s)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Stop() })
		if got := drivertest.NetNSOf(t, p.PID()); got != drivertest.NSInode(t, n.NS) {
			t.Errorf("attached vmm in network namespace %d, want the given one", got)
		}
	})
}

// TestAttachedOutlivesThreads: an attached VMM (its parent-death signal
// set) lives on when the thread that asked for it ends, as Go ends a
// thread whose goroutine returns locked to it, and is gone once stopped.
// Three starts: Go cannot end its main thread, which may run one of them.
func TestAttachedOutlivesThreads(t *testing.T) {
	var ps []*Process
	for range 3 {
		dir := t.TempDir()
		s := serving(t, dir)
		s.Attached = true
		started := make(chan *Process, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: this thread ends with the goroutine
			p, err := Start(context.Background(), dir, s)
			if err != nil {
				t.Error(err)
			}
			started <- p
		}()
		p := <-started
		if p == nil {
			t.FailNow()
		}
		t.Cleanup(func() { p.Stop() })
		ps = append(ps, p)
	}
	time.Sleep(100 * time.Millisecond)
	for _, p := range ps {
		short, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		err := p.Wait(short)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("an attached vmm ended with the thread that started it: %v", err)
		}
		if err := p.Stop(); err != nil {
			t.Fatal(err)
		}
		if !gone(p.PID()) {
			t.Errorf("pid %d left after Stop", p.PID())
		}
	}
}
