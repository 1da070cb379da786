package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// fakeBinary writes a shell script standing in for qemu-system-x86_64. It
// answers --version like QEMU and otherwise runs body, with its pid
// recorded in dir/pid.
func fakeBinary(t *testing.T, dir, body string) string {
	t.Helper()
	path := filepath.Join(dir, "fake-qemu")
	script := "#!/bin/sh\n" +
		"if [ \"$1\" = --version ]; then echo 'QEMU emulator version 7.2.22 (fake)'; exit 0; fi\n" +
		"echo $$ > " + "'" + filepath.Join(dir, "pid") + "'" + "\n" + body + "\n"
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func readPID(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "pid"))
	if err != nil {
		t.Fatalf("fake qemu never ran: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// TestBootFailures checks each way a QEMU can fail to come up: a QEMU that
// never answers is given up on when the context ends, and one that dies
// fails the boot with its own error, not by running out the context.
func TestBootFailures(t *testing.T) {
	testenv.RequireRoot(t)
	tests := []struct {
		name    string
		body    string
		timeout time.Duration
		want    string
		// deadline: only the context's deadline ends the wait.
		deadline bool
	}{
		{"qmp never answers", "exec sleep 600", time.Second, "wait for qmp greeting", true},
		{"qemu exits at once", "echo 'qemu-system-x86_64: -object memory-backend-file: bad' >&2; exit 1", time.Minute, "memory-backend-file: bad", false},
		{"qemu greets then dies", `exec 3>&-; exit 0`, time.Minute, "qemu exited", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			d := New(config.QEMU{Binary: fakeBinary(t, dir, tt.body), Accel: "tcg"})
			runDir := filepath.Join(dir, "run")
			v, err := d.Boot(testContext(t, tt.timeout), BootSpec{MemoryBytes: testMemory, VCPUs: 1, RunDir: runDir})
			if err == nil {
				v.Close()
				t.Fatal("boot succeeded on a fake qemu")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err %q, want it to contain %q", err, tt.want)
			}
			if got := errors.Is(err, context.DeadlineExceeded); got != tt.deadline {
				t.Errorf("err %q: ended by the context's deadline %v, want %v", err, got, tt.deadline)
			}
			assertGone(t, readPID(t, dir), runDir)
		})
	}
}

// A run dir that cannot be QEMU's is refused before QEMU starts, and one
// that was not there is not left behind.
func TestBootRunDirRefusals(t *testing.T) {
	dir := t.TempDir()
	d := New(config.QEMU{Binary: fakeBinary(t, dir, "exit 1"), Accel: "tcg"})
	long := filepath.Join(dir, strings.Repeat("r", 120))
	tests := []struct {
		name, runDir, want string
	}{
		{"socket path too long", long, "unix sockets allow"},
		{"run dir exists", dir, "create run dir"},
		{"no run dir", "", "create run dir"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := d.Boot(testContext(t, time.Minute), BootSpec{MemoryBytes: testMemory, VCPUs: 1, RunDir: tt.runDir, MemPath: filepath.Join(dir, "memory")})
			if err == nil {
				v.Close()
				t.Fatal("boot succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err %q, want it to contain %q", err, tt.want)
			}
		})
	}
	if _, err := os.Stat(long); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("refused run dir created: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "pid")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("qemu started for a refused run dir: %v", err)
	}
}

func TestRestoreKilledDuringLoad(t *testing.T) {
	d := newTestDriver(t)
	root := t.TempDir()
	s := newStager(t, root, bakeBare(t, d, root))
	staged := s.stage()
	// A FIFO that never gets data keeps the load waiting, so the kill
	// lands in it. It replaces the state once QEMU runs, after the driver
	// checked the real one; holding its write end lets the driver open it.
	state := filepath.Join(staged, StateFile)
	runDir := s.runDir()
	killed := make(chan int, 1)
	var fifo *os.File
	req := hypervisor.RestoreRequest{StagedDir: staged, RunDir: runDir, Mode: hypervisor.ModeMmap,
		OnPhase: func(phase string, _ time.Duration) {
			if phase != "spawn" {
				return
			}
			if err := os.Remove(state); err != nil {
				t.Error(err)
			}
			if err := syscall.Mkfifo(state, 0o600); err != nil {
				t.Error(err)
			}
			var err error
			if fifo, err = os.OpenFile(state, os.O_RDWR, 0); err != nil {
				t.Error(err)
			}
			go func() { killed <- killWhenLoading(runDir, state) }()
		}}
	t.Cleanup(func() {
		if fifo != nil {
			fifo.Close()
		}
	})
	v, err := d.Restore(testContext(t, 30*time.Second), req)
	if err == nil {
		v.Close()
		t.Fatal("restore succeeded, want qemu exited with signal: killed")
	}
	if !strings.Contains(err.Error(), "signal: killed") {
		t.Fatalf("restore err %v, want qemu exited with signal: killed", err)
	}
	pid := <-killed
	if pid == 0 {
		t.Fatal("the qemu process was not found to kill")
	}
	assertGone(t, pid, runDir)
}

// killWhenLoading waits until QEMU holds the device-state file, then kills
// it. It returns the pid killed, or 0.
func killWhenLoading(runDir, state string) int {
	pid := pidUsing(filepath.Join(runDir, agentSock))
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if holdsFile(pid, state) {
			syscall.Kill(pid, syscall.SIGKILL)
			return pid
		}
	}
	return 0
}

func holdsFile(pid int, path string) bool {
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		if target, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); target == path {
			return true
		}
	}
	return false
}

func TestRestoreRejectsBadRequests(t *testing.T) {
	d := newTestDriver(t)
	root := t.TempDir()
	s := newStager(t, root, bakeBare(t, d, root))
	tests := []struct {
		name   string
		mode   hypervisor.Mode
		modify func(staged string)
		want   string
	}{
		{"ondemand", hypervisor.ModeOnDemand, func(string) {}, `mode "ondemand"`},
		{"no chain.json", hypervisor.ModeMmap, func(s string) { os.Remove(filepath.Join(s, "chain.json")) }, "open staged chain"},
		{"shape mismatch", hypervisor.ModeMmap, func(s string) {
			shape, _ := ReadShape(filepath.Join(s, ShapeFile))
			shape.MemoryBytes *= 2
			os.Remove(filepath.Join(s, ShapeFile))
			WriteShape(s, shape)
		}, "does not match link.json"},
		{"truncated memory", hypervisor.ModeCopy, func(s string) {
			m := filepath.Join(s, "memory")
			os.Remove(m)
			os.WriteFile(m, []byte("short"), 0o644)
		}, "staged memory"},
		{"corrupt device state", hypervisor.ModeMmap, func(s string) {
			os.WriteFile(filepath.Join(s, StateFile), []byte("not a migration stream"), 0o644)
		}, "not a QEMU migration stream"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			staged := s.stage()
			tt.modify(staged)
			runDir := s.runDir()
			v, err := d.Restore(testContext(t, 30*time.Second), hypervisor.RestoreRequest{StagedDir: staged, RunDir: runDir, Mode: tt.mode})
			if err == nil {
				v.Close()
				t.Fatal("restore succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %q, want it to contain %q", err, tt.want)
			}
			assertGone(t, pidUsing(filepath.Join(runDir, agentSock)), runDir)
		})
	}
}
