package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// recordingHook is a hook script that appends its argument (the hook's
// kind) and the state on its stdin, as one line, to the log next to it.
const recordingHook = `#!/bin/sh
printf '%s %s\n' "$1" "$(cat)" >> "$(dirname "$0")/hooks.log"
`

// withHooks sets the spec's hooks.
func withHooks(h *specs.Hooks) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Hooks = h
		return nil
	}
}

// TestHooks: every hook runs once, on the host, in runc's order, with the
// state JSON (the hypervisor's pid, the status of its point) on stdin.
func TestHooks(t *testing.T) {
	c := stack(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	script := filepath.Join(dir, "hook")
	if err := os.WriteFile(script, []byte(recordingHook), 0o755); err != nil {
		t.Fatal(err)
	}
	hook := func(kind string) []specs.Hook { return []specs.Hook{{Path: script, Args: []string{"hook", kind}}} }
	task, err := newSpecTask(ctx, t, c, imageRef, "hooked", withHooks(&specs.Hooks{
		//lint:ignore SA1019 prestart is deprecated, but runc still runs it, and so does cocoon
		Prestart: hook("prestart"), CreateRuntime: hook("createRuntime"), CreateContainer: hook("createContainer"),
		Poststart: hook("poststart"), Poststop: hook("poststop"),
	}))
	if err != nil {
		t.Fatal(err)
	}
	pid := int(task.Pid())
	exited, err := task.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatal(err)
	}
	<-exited
	if _, err := task.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "hooks.log"))
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ kind, status string }{
		{"prestart", "creating"}, {"createRuntime", "creating"}, {"createContainer", "creating"},
		{"poststart", "running"}, {"poststop", "stopped"},
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != len(want) {
		t.Fatalf("hooks ran %d times, want %d:\n%s", len(lines), len(want), data)
	}
	for i, line := range lines {
		kind, stateJSON, _ := strings.Cut(line, " ")
		var st specs.State
		if err := json.Unmarshal([]byte(stateJSON), &st); err != nil {
			t.Fatalf("hook %d (%s) got state %q: %v", i, kind, stateJSON, err)
		}
		if kind != want[i].kind || string(st.Status) != want[i].status || st.ID != "hooked" || st.Pid != pid || st.Bundle == "" {
			t.Errorf("hook %d: %s with %+v, want %s with status %s, id hooked, pid %d (the hypervisor) and the bundle", i, kind, st, want[i].kind, want[i].status, pid)
		}
	}
}

// TestFailingHooks: a createRuntime hook that fails or outlives its
// timeout fails the create with its output or the timeout in the error,
// and leaves no VM behind.
func TestFailingHooks(t *testing.T) {
	c := stack(t, "")
	one := 1
	for _, tc := range []struct {
		name string
		hook specs.Hook
		want string
	}{
		{"exits 1", specs.Hook{Path: "/bin/sh", Args: []string{"sh", "-c", "echo hook says no >&2; exit 1"}}, "hook says no"},
		{"outlives its timeout", specs.Hook{Path: "/bin/sh", Args: []string{"sh", "-c", "sleep 60"}, Timeout: &one}, "timed out"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			_, err := newSpecTask(ctx, t, c, imageRef, "failing", withHooks(&specs.Hooks{CreateRuntime: []specs.Hook{tc.hook}}))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "createRuntime") {
				t.Fatalf("create with a failing hook: %v, want an error naming the createRuntime hook and %q", err, tc.want)
			}
			if left := c.InUse(); len(left) > 0 {
				t.Fatalf("a failed create left %v", left)
			}
		})
	}
}
