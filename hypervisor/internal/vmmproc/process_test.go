package vmmproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// envServe makes the re-executed test binary a VMM that serves its API
// socket (the value) until it is killed.
const envServe = "VMMPROC_TEST_SERVE"

func TestMain(m *testing.M) {
	if sock := os.Getenv(envServe); sock != "" {
		ln, err := net.Listen("unix", sock)
		if err != nil {
			os.Exit(1)
		}
		defer ln.Close()
		select {}
	}
	os.Exit(m.Run())
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
		if err := p.Wait(ctx); err != nil {
			t.Fatalf("wait after kill: %v", err)
		}
	}
	if err := p.Kill(); err != nil {
		t.Errorf("kill of a reaped vmm: %v", err)
	}
	if !gone(p.PID()) {
		t.Errorf("pid %d not reaped", p.PID())
	}
}

func TestStartFailures(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	tests := []struct {
		name string
		spec Spec
		want string
	}{
		{"exits at once", Spec{Binary: script(t, "exit 3"), Socket: "api.sock"}, "exited before serving its API: exit status 3"},
		{"never serves", Spec{Binary: script(t, "echo $$ > "+pidFile+"\nexec sleep 30"), Socket: "api.sock"}, "wait for api socket"},
		{"no binary", Spec{Binary: "/nonexistent/vmm", Socket: "api.sock"}, "start /nonexistent/vmm"},
		{"socket path too long", Spec{Binary: "/bin/true", Socket: "/" + strings.Repeat("s", MaxSockPath)}, "unix sockets allow 107"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			dir := t.TempDir()
			tt.spec.Log = "vmm.log"
			if !strings.HasPrefix(tt.spec.Socket, "/") {
				tt.spec.Socket = filepath.Join(dir, tt.spec.Socket)
			}
			if _, err := Start(ctx, dir, tt.spec); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one containing %q", err, tt.want)
			}
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
