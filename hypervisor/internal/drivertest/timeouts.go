package drivertest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/apifake"
)

// Timeouts describes a driver to RestoreTimeouts.
type Timeouts struct {
	// Driver returns a driver running bin as its VMM.
	Driver func(bin string) hypervisor.Driver
	// Hang is a fake VMM that never answers the load request.
	Hang apifake.Fake
	// HangErr is what the error of a restore on Hang says.
	HangErr string
	// Stage stages a chain the driver restores.
	Stage func(testing.TB) string
}

// RestoreTimeouts checks that a restore on a VMM that never answers the
// load request, never serves its API or exits at once fails within the
// caller's deadline, and leaves neither the process nor the run dir.
func RestoreTimeouts(t *testing.T, c Timeouts) {
	hang, hangRecord := c.Hang.Script(t)
	silent, silentPids := stubVMM(t, "exec sleep 30")
	dies, _ := stubVMM(t, "exit 3")
	tests := []struct {
		name, bin string
		pids      func() []int
		want      string
	}{
		{"load never answered", hang, func() []int { return apifake.PIDs(t, hangRecord) }, c.HangErr},
		{"api socket never appears", silent, func() []int { return readPIDs(t, silentPids) }, "wait for api socket"},
		{"vmm exits at once", dies, func() []int { return nil }, "exited before serving its API"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			d := c.Driver(tt.bin)
			if _, err := d.Capabilities(ctx); err != nil {
				t.Fatal(err)
			}
			run := RunDir(t)
			_, err := d.Restore(ctx, hypervisor.RestoreRequest{StagedDir: c.Stage(t), RunDir: run, Mode: hypervisor.ModeCopy})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one containing %q", err, tt.want)
			}
			if _, err := os.Stat(run); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("run dir left behind: %v", err)
			}
			for _, pid := range tt.pids() {
				if apifake.Alive(pid) {
					t.Errorf("pid %d still running", pid)
				}
			}
		})
	}
}

// stubVMM writes a binary that answers --version and otherwise runs body,
// recording its pid; it returns the binary and the pid file.
func stubVMM(t *testing.T, body string) (bin, pidFile string) {
	dir := t.TempDir()
	bin, pidFile = filepath.Join(dir, "vmm"), filepath.Join(dir, "pid")
	script := "#!/bin/sh\n[ \"$1\" = --version ] && { echo stub v1; exit 0; }\necho $$ > " + pidFile + "\n" + body + "\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin, pidFile
}

func readPIDs(t *testing.T, path string) []int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("stub vmm never ran: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return []int{pid}
}
