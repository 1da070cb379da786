package container

import (
	"context"
	"errors"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestWarmLeavesNothing: with the host's runc, Warm creates its container
// (runc makes its root, which did not exist) and leaves no state, bundle,
// cgroup or process of it: its init, orphaned to the agent, is reaped.
func TestWarmLeavesNothing(t *testing.T) {
	m := testManager(t)
	m.cfg.RuncRoot = filepath.Join(t.TempDir(), "runc")
	before := children(t)
	if err := m.Warm(context.Background(), false); err != nil {
		t.Fatalf("warm: %v", err)
	}
	if after := children(t); !slices.Equal(after, before) {
		t.Errorf("the agent's children are %v after the warm-up, %v before", after, before)
	}
	left, err := os.ReadDir(m.cfg.RuncRoot)
	if err != nil {
		t.Fatalf("runc's root, made by its create: %v", err)
	}
	if len(left) != 0 {
		t.Errorf("runc's root holds %v after the warm-up", left)
	}
	if _, err := os.Stat(filepath.Join(m.cfg.StateDir, warmID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the warm-up's bundle is left: %v", err)
	}
	for _, dir := range cgroupDirs(path.Join(m.cfg.CgroupParent, warmID)) {
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the warm-up's cgroup %s is left: %v", dir, err)
		}
	}
}

// children are the pids of this process's children, zombies included.
func children(t *testing.T) []string {
	t.Helper()
	paths, err := filepath.Glob("/proc/self/task/*/children")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no /proc/self/task/*/children (CONFIG_PROC_CHILDREN): %v", err)
	}
	var pids []string
	for _, p := range paths {
		// A thread that ended meanwhile has no file left.
		if data, err := os.ReadFile(p); err == nil {
			pids = append(pids, strings.Fields(string(data))...)
		}
	}
	slices.Sort(pids)
	return pids
}
