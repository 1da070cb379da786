package ctrdtest

import (
	"strings"
	"testing"
)

func TestStartAndCleanup(t *testing.T) {
	c := Start(t, Options{})
	out, err := c.Ctr("plugins", "ls")
	if err != nil {
		t.Fatal(err)
	}
	if !hasPlugin(out, "io.containerd.snapshotter.v1", Snapshotter) {
		t.Errorf("containerd does not list the %s proxy snapshotter as ok:\n%s", Snapshotter, out)
	}
	if _, err := c.Client().SnapshotService(Snapshotter).Stat(t.Context(), "none"); err == nil {
		t.Error("Stat of a missing snapshot through the proxy succeeded")
	}
	dir := c.Dir
	c.Cleanup()
	c.Cleanup() // a second call is a no-op
	if left := Leftovers(dir); len(left) > 0 {
		t.Errorf("Cleanup left:\n%s", strings.Join(left, "\n"))
	}
}

// hasPlugin reports whether `ctr plugins ls` output lists typ/id as ok.
func hasPlugin(out, typ, id string) bool {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 4 && f[0] == typ && f[1] == id && f[len(f)-1] == "ok" {
			return true
		}
	}
	return false
}
