package server

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

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

func TestReadCommand(t *testing.T) {
	long := strings.Repeat("a", 100000)
	for _, tc := range []struct {
		name, cmdline string
		want          string
		cut, ok       bool
	}{
		{"args", "sleep\x00100\x00", "sleep 100", false, true},
		{"kernel thread", "", "", false, false},
		{"exactly the bound", strings.Repeat("b", maxCommandLen), strings.Repeat("b", maxCommandLen), false, true},
		{"huge", "sh\x00" + strings.Repeat(long+"\x00", 20), "sh " + strings.Repeat(long+" ", 20)[:maxCommandLen-3], true, true},
		{"invalid UTF-8", "echo\x00\xff\xfe\x00", "echo \uFFFD", false, true},
		{"a character across the bound", strings.Repeat("c", maxCommandLen-1) + "é", strings.Repeat("c", maxCommandLen-1), true, true},
		{"replacements past the bound", strings.Repeat("\xffa", maxCommandLen/2), strings.Repeat("\uFFFDa", maxCommandLen/4), true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "cmdline")
			if err := os.WriteFile(p, []byte(tc.cmdline), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd, cut, ok := readCommand(p)
			if cmd != tc.want || cut != tc.cut || ok != tc.ok {
				t.Errorf("readCommand = %.40q (%d bytes) cut %v ok %v, want %.40q (%d bytes) cut %v ok %v",
					cmd, len(cmd), cut, ok, tc.want, len(tc.want), tc.cut, tc.ok)
			}
			if !utf8.ValidString(cmd) || len(cmd) > maxCommandLen {
				t.Errorf("command of %d bytes, valid UTF-8 %v", len(cmd), utf8.ValidString(cmd))
			}
		})
	}
}

// TestProcessesBounded lists more processes with huge commands than one
// reply holds: the reply stays under its bound, says how many it left out,
// and marshals (a command that is not UTF-8 would not).
func TestProcessesBounded(t *testing.T) {
	// Above Linux's PID_MAX_LIMIT (1<<22): never the test's own pid, which
	// Processes leaves out.
	const n, first = 400, 5_000_000
	files := map[string]string{}
	for pid := first; pid < first+n; pid++ {
		files[fmt.Sprintf("%d/stat", pid)] = fmt.Sprintf("%d (sh) S 1 1 1 0 -1", pid)
		files[fmt.Sprintf("%d/cmdline", pid)] = "sh\x00\xff" + strings.Repeat("a", 2*maxCommandLen)
	}
	fakeProc(t, files)
	s := &Service{procs: map[string]*process{}}
	resp, err := s.Processes(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(resp.Processes) + int(resp.Omitted); got != n || resp.Omitted == 0 {
		t.Errorf("%d listed and %d omitted, want %d in all, some omitted", len(resp.Processes), resp.Omitted, n)
	}
	if size := proto.Size(resp); size > maxProcessesSize+8 {
		t.Errorf("reply of %d bytes, bound %d", size, maxProcessesSize)
	}
	for _, p := range resp.Processes {
		if !p.CommandTruncated || len(p.Command) > maxCommandLen {
			t.Fatalf("process %d: command of %d bytes, truncated %v", p.Pid, len(p.Command), p.CommandTruncated)
		}
	}
	if _, err := proto.Marshal(resp); err != nil {
		t.Errorf("marshal the reply: %v", err)
	}
}
