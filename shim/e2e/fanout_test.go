package e2e

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/ctrdtest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// TestFanOut starts 8 tasks of one image at once in mmap mode: all print
// their output, the flat memory file is hard-linked once per running task,
// and after they are gone it is linked only by the snapshotter's cache.
func TestFanOut(t *testing.T) {
	const n = 8
	c := stack(t, "[restore]\nmode = \"mmap\"\n")
	var wg sync.WaitGroup
	outs, errs := make([]string, n), make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], errs[i] = run(c, []string{"--rm"}, fmt.Sprintf("f%d", i),
				"sh", "-c", fmt.Sprintf("echo hello-%d; sleep 30", i))
		}()
	}
	waitRunning(t, c, n)
	flat, links := flatMemory(t, c, "f0")
	if links != n+1 {
		t.Errorf("flat memory %s has %d links with %d mmap tasks running, want %d", flat, links, n, n+1)
	}
	wg.Wait()
	for i := range n {
		if want := fmt.Sprintf("hello-%d", i); errs[i] != nil || strings.TrimSpace(outs[i]) != want {
			t.Errorf("task f%d printed %q (%v), want %s", i, outs[i], errs[i], want)
		}
	}
	// containerd removes the tasks' snapshots when it collects garbage.
	c.CollectGarbage()
	if n := nlink(t, flat); n != 1 {
		t.Fatalf("flat memory has %d links after the tasks are gone, want 1", n)
	}
}

// waitRunning waits until n tasks are RUNNING.
func waitRunning(t *testing.T, c *ctrdtest.Containerd, n int) {
	t.Helper()
	testenv.Eventually(t, 3*time.Minute, fmt.Sprintf("%d tasks running at once", n), func() error {
		out, err := c.Ctr("task", "ls")
		if err != nil {
			return err
		}
		if got := strings.Count(out, "RUNNING"); got != n {
			return fmt.Errorf("%d running", got)
		}
		return nil
	})
}

// flatMemory finds the snapshotter's flat memory file that task id's
// staged memory links to, and its link count.
func flatMemory(t *testing.T, c *ctrdtest.Containerd, id string) (string, uint64) {
	t.Helper()
	report := readReport(t, c, id)
	var staged syscall.Stat_t
	if err := syscall.Stat(filepath.Join(report.StagedDir, "memory"), &staged); err != nil {
		t.Fatal(err)
	}
	var flat string
	err := filepath.WalkDir(c.SnapshotterRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() || flat != "" {
			return err
		}
		var st syscall.Stat_t
		if syscall.Stat(path, &st) == nil && st.Ino == staged.Ino && st.Dev == staged.Dev && !isStaged(path) {
			flat = path
		}
		return nil
	})
	if err != nil || flat == "" {
		t.Fatalf("no flat memory file shares inode %d under %s (%v)", staged.Ino, c.SnapshotterRoot, err)
	}
	return flat, uint64(staged.Nlink)
}

// isStaged reports whether path is a task's staged link rather than the
// cache's file: staged dirs hold a chain.json next to their memory.
func isStaged(path string) bool {
	_, err := os.Stat(filepath.Join(filepath.Dir(path), "chain.json"))
	return err == nil
}
