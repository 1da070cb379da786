package container

import (
	"context"
	"errors"
	"os"
	"path"
	"path/filepath"
	"testing"
)

// TestWarmLeavesNothing: with the host's runc, Warm creates its container
// (runc makes its root, which did not exist) and leaves no state, bundle
// or cgroup of it.
func TestWarmLeavesNothing(t *testing.T) {
	m := testManager(t)
	m.cfg.RuncRoot = filepath.Join(t.TempDir(), "runc")
	if err := m.Warm(context.Background()); err != nil {
		t.Fatalf("warm: %v", err)
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
