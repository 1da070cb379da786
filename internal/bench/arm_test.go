package bench

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fakeArm starts clones that are this process, failing those fail says.
type fakeArm struct {
	fail    func(id string) bool
	stopped atomic.Int32
}

func (a *fakeArm) start(_ context.Context, id string) (*clone, error) {
	if a.fail(id) {
		return nil, errors.New("guest stuck: " + id)
	}
	return &clone{pid: os.Getpid(), ready: d(10), phases: []phase{{"agent", d(5)}},
		stop: func(context.Context) error { a.stopped.Add(1); return nil }}, nil
}

func TestRunCellFailures(t *testing.T) {
	tests := []struct {
		name      string
		fail      func(id string) bool
		wantErr   bool
		wantReady int
	}{
		{"all start", func(string) bool { return false }, false, 3},
		{"one fails", func(id string) bool { return strings.HasSuffix(id, "-1") }, false, 2},
		{"all fail", func(string) bool { return true }, true, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := &fakeArm{fail: tt.fail}
			run, err := runCell(t.Context(), armAt{id: armID{Path: PathCold}, arm: a}, 3, 0)
			if (err != nil) != tt.wantErr {
				t.Fatalf("runCell error %v, want error %v", err, tt.wantErr)
			}
			if int(a.stopped.Load()) != tt.wantReady {
				t.Errorf("stopped %d clones, want %d (every one that started)", a.stopped.Load(), tt.wantReady)
			}
			if err != nil {
				return
			}
			if len(run.ready) != tt.wantReady || len(run.failed) != 3-tt.wantReady || len(run.mem) != tt.wantReady {
				t.Errorf("run has %d samples, %d memory readings, %d failures: want %d, %d, %d",
					len(run.ready), len(run.mem), len(run.failed), tt.wantReady, tt.wantReady, 3-tt.wantReady)
			}
		})
	}
}

func TestFailuresReported(t *testing.T) {
	run := cellRun{ready: []time.Duration{d(10)}, wall: d(10), mem: []cloneMemory{{pss: 1024}},
		phases: [][]phase{{}}, failed: []error{errors.New("stuck"), errors.New("stuck"), errors.New("gone")}}
	c := summarize(cellKey{armID{Path: PathCold}, 4}, []cellRun{run})
	if c.Failed != 3 || len(c.Errors) != 2 || c.Samples != 1 {
		t.Fatalf("cell failed %d, errors %q, samples %d: want 3 failures, 2 distinct errors, 1 sample", c.Failed, c.Errors, c.Samples)
	}
	md := (&results{Cells: []cellResult{c}}).markdown("")
	if !strings.Contains(md, "**3 of 4 starts of cold at N=4 failed**") || !strings.Contains(md, "stuck; gone") {
		t.Errorf("markdown does not report the failures:\n%s", md)
	}
}
