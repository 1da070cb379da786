package server

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

func fakeProc(t *testing.T, files map[string]string) {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old := procRoot
	procRoot = dir
	t.Cleanup(func() { procRoot = old })
}

func TestReadCPUAndMemory(t *testing.T) {
	fakeProc(t, map[string]string{
		"stat":    "cpu  100 20 30 400 5 0 0 0 0 0\ncpu0 100 20 30 400 5 0 0 0 0 0\n",
		"meminfo": "MemTotal:  262144 kB\nMemFree:  100 kB\nMemAvailable:   2048 kB\n",
	})
	var resp api.StatsResponse
	if err := readCPU(&resp); err != nil {
		t.Fatal(err)
	}
	if resp.CpuUserNs != uint64(1200*time.Millisecond) || resp.CpuSystemNs != uint64(300*time.Millisecond) || resp.CpuIdleNs != uint64(4*time.Second) {
		t.Errorf("cpu user %d system %d idle %d", resp.CpuUserNs, resp.CpuSystemNs, resp.CpuIdleNs)
	}
	avail, err := memAvailable()
	if err != nil || avail != 2048<<10 {
		t.Errorf("MemAvailable %d %v, want %d", avail, err, 2048<<10)
	}
}

func TestReadProcess(t *testing.T) {
	fakeProc(t, map[string]string{
		"42/stat":    "42 (my (odd) cmd) S 7 42 42 0 -1",
		"42/cmdline": "sleep\x00100\x00",
		"2/stat":     "2 (kthreadd) S 0 0 0 0 -1",
		"2/cmdline":  "",
	})
	p, ok := readProcess(42)
	if !ok || p.Pid != 42 || p.Ppid != 7 || p.Command != "sleep 100" {
		t.Errorf("readProcess(42) = %+v %v", p, ok)
	}
	if _, ok := readProcess(2); ok {
		t.Error("a kernel thread was listed")
	}
}
