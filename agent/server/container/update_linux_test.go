package container

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// TestUpdateAndStats: an update reaches the container's cgroup; bad
// resources and an exited container are refused; stats need cgroup v2.
func TestUpdateAndStats(t *testing.T) {
	m := testManager(t)
	c := startSleeper(t, m, "update", busyboxRoot(t), oci.WithMemoryLimit(64<<20))
	ctx := context.Background()
	if err := c.Update(ctx, []byte(`{"memory":{"limit":50331648}}`)); err != nil {
		t.Fatalf("update: %v", err)
	}
	file := filepath.Join(cgroupRoot, "memory", c.cgroup, "memory.limit_in_bytes")
	if cgroups.Mode() == cgroups.Unified {
		file = filepath.Join(cgroupRoot, c.cgroup, "memory.max")
	}
	if data, err := os.ReadFile(file); err != nil || strings.TrimSpace(string(data)) != "50331648" {
		t.Errorf("%s after the update: %q, %v; want 50331648", file, data, err)
	}
	if err := c.Update(ctx, []byte(`{"memory":`)); !errdefs.IsInvalidArgument(err) {
		t.Errorf("update with bad JSON: %v, want InvalidArgument", err)
	}
	st, err := cgroupStats(c.cgroup)
	if cgroups.Mode() == cgroups.Unified {
		if err != nil || !strings.HasSuffix(st.GetTypeUrl(), "io.containerd.cgroups.v2.Metrics") {
			t.Errorf("stats: %v, %v", st, err)
		}
	} else if !errdefs.IsFailedPrecondition(err) {
		t.Errorf("stats on cgroup v1: %v, want FailedPrecondition", err)
	}
	if err := c.Signal(ctx, "", unix.SIGKILL, false); err != nil {
		t.Fatal(err)
	}
	waitExit(t, c, "")
	if err := c.Update(ctx, []byte(`{"memory":{"limit":50331648}}`)); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("update an exited container: %v, want FailedPrecondition", err)
	}
}
