package state

import (
	"github.com/cocoonstack/containerd-shim-cocoon/config"

	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestTaskRoundTrip(t *testing.T) {
	bundle := t.TempDir()
	want := &Task{
		ID:         "t1",
		Hypervisor: "qemu",
		PID:        42,
		PIDStart:   1234,
		RunDir:     "/run/cocoon/t1",
		StagedDir:  "/var/lib/cocoon/staged/7",
		Cgroup:     "/default/t1",
		Plan:       Plan{Mode: "mmap", Reasons: []string{"best mode of qemu"}},
		Exit:       &Exit{Status: 7, At: time.Date(2026, 11, 29, 16, 0, 0, 0, time.UTC)},
	}
	if err := WriteTask(bundle, want); err != nil {
		t.Fatal(err)
	}
	got, err := ReadTask(bundle)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, want)
	}
	entries, err := os.ReadDir(bundle)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Fatalf("bundle holds %d entries after an atomic write, want only %s", len(entries), TaskFile)
	}
}

func TestReadTaskMissing(t *testing.T) {
	_, err := ReadTask(t.TempDir())
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("ReadTask of an empty bundle = %v, want os.ErrNotExist", err)
	}
}

func TestReportDurationsAreReadable(t *testing.T) {
	bundle := t.TempDir()
	r := &Report{ID: "t1", Plan: Plan{Mode: "copy"}, Total: config.Duration(1500 * time.Millisecond)}
	if err := WriteReport(bundle, r); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(bundle, ReportFile))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"total": "1.5s"`) {
		t.Fatalf("report does not carry a readable total:\n%s", data)
	}
	got, err := ReadReport(bundle)
	if err != nil {
		t.Fatal(err)
	}
	if got.Total != r.Total {
		t.Fatalf("total = %v, want %v", got.Total, r.Total)
	}
}

// TestReportReplaced rewrites the report as Create and Start do: the new
// one replaces the old and no temp file stays in the bundle.
func TestReportReplaced(t *testing.T) {
	bundle := t.TempDir()
	for _, phases := range [][]Phase{
		{{Name: "spawn", Duration: config.Duration(time.Millisecond)}},
		{{Name: "spawn", Duration: config.Duration(time.Millisecond)}, {Name: "process started", Duration: config.Duration(2 * time.Millisecond)}},
	} {
		if err := WriteReport(bundle, &Report{ID: "t1", Phases: phases}); err != nil {
			t.Fatal(err)
		}
		got, err := ReadReport(bundle)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got.Phases, phases) {
			t.Fatalf("phases %+v, want %+v", got.Phases, phases)
		}
	}
	entries, err := os.ReadDir(bundle)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Fatalf("bundle holds %d entries, want only %s", len(entries), ReportFile)
	}
	fi, err := os.Stat(filepath.Join(bundle, ReportFile))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("report mode %v, want 0600", fi.Mode().Perm())
	}
}

func TestParseStartTime(t *testing.T) {
	tests := []struct {
		name    string
		stat    string
		want    uint64
		wantErr bool
	}{
		{"plain", "12 (qemu) S 1 12 12 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 3 0 98765 1000 10", 98765, false},
		{"comm with spaces and parens", "12 (a) b (c) S 1 12 12 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 3 0 555 1000", 555, false},
		{"truncated", "12 (qemu) S 1 12", 0, true},
		{"no comm", "12 qemu S", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStartTime(tt.stat)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("parseStartTime = %d, %v; want %d, error %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestRunning(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	start, err := StartTime(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		task Task
		want bool
	}{
		{"same process", Task{PID: cmd.Process.Pid, PIDStart: start}, true},
		{"recycled pid", Task{PID: cmd.Process.Pid, PIDStart: start + 1}, false},
		{"no pid", Task{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.task.Running(); got != tt.want {
				t.Fatalf("Running() = %v, want %v", got, tt.want)
			}
		})
	}
}
