package cloudhypervisor

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/apifake"
)

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

func TestRestoreTimeouts(t *testing.T) {
	hang, hangRecord := apifake.Fake{Spec: apifake.SpecCHFork, Name: "cloud-hypervisor", Version: "v53.0", Hang: []string{"vm.restore"}}.Script(t)
	silent, silentPids := stubVMM(t, "exec sleep 30")
	dies, _ := stubVMM(t, "exit 3")
	tests := []struct {
		name, bin string
		pids      func() []int
		want      string
	}{
		{"vm.restore never answers", hang, func() []int { return apifake.PIDs(t, hangRecord) }, "vm.restore: context deadline exceeded"},
		{"api socket never appears", silent, func() []int { return readPIDs(t, silentPids) }, "wait for api socket"},
		{"vmm exits at once", dies, func() []int { return nil }, "exited before serving its API"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			d := New(config.CloudHypervisor{Binary: tt.bin, CopyOnWrite: "no"})
			if _, err := d.Capabilities(ctx); err != nil {
				t.Fatal(err)
			}
			run := runDir(t)
			_, err := d.Restore(ctx, hypervisor.RestoreRequest{StagedDir: stageChain(t), RunDir: run, Mode: hypervisor.ModeCopy})
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
