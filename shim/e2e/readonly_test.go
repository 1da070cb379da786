package e2e

import (
	"strings"
	"testing"
)

// writeProbe reports whether the root takes a write.
var writeProbe = []string{"sh", "-c", "touch /written 2>/dev/null && echo root-writable || echo root-read-only"}

// TestSnapshotImageReadOnlyRoot: a snapshot image asked for a read-only
// root (ctr's --read-only) runs its process, and its execs, where the
// guest's root is read-only; without the ask the root takes writes.
func TestSnapshotImageReadOnlyRoot(t *testing.T) {
	c := stack(t, "")
	for _, tc := range []struct {
		name  string
		flags []string
		want  string
	}{
		{"writable", []string{"--rm"}, "root-writable"},
		{"read-only", []string{"--rm", "--read-only"}, "root-read-only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := run(c, tc.flags, "ro", writeProbe...)
			if err != nil || strings.TrimSpace(out) != tc.want {
				t.Fatalf("ctr run: %q %v, want %s", out, err, tc.want)
			}
		})
	}
	t.Run("exec", func(t *testing.T) {
		if _, err := run(c, []string{"-d", "--read-only"}, "ro-exec", "sleep", "600"); err != nil {
			t.Fatal(err)
		}
		defer removeTask(t, c, "ro-exec")
		out, err := c.Ctr(append([]string{"task", "exec", "--exec-id", "e1", "--fifo-dir", c.FifoDir, "ro-exec"}, writeProbe...)...)
		if err != nil || strings.TrimSpace(out) != "root-read-only" {
			t.Errorf("the exec: %q %v, want root-read-only", out, err)
		}
	})
}
