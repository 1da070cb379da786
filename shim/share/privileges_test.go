//go:build !cgo

package share

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestShareDropsPrivileges: the helper, built as the shim server is
// (without cgo; make test runs this package so too), serves with
// no_new_privs and keptCaps alone, on every thread.
func TestShareDropsPrivileges(t *testing.T) {
	_, guest, srv := serveDir(t, ReadWrite)
	if _, err := os.ReadDir(guest); err != nil {
		t.Fatal(err)
	}
	pid := srv.helper.Process.Pid
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, task.Name()))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(l, ":")
			v = strings.TrimSpace(v)
			switch k {
			case "CapEff", "CapPrm", "CapBnd":
				if got, _ := strconv.ParseUint(v, 16, 64); got != KeptCapsMask() {
					t.Errorf("thread %s: %s %s, want %x", task.Name(), k, v, KeptCapsMask())
				}
			case "CapInh", "CapAmb":
				if got, _ := strconv.ParseUint(v, 16, 64); got != 0 {
					t.Errorf("thread %s: %s %s, want 0", task.Name(), k, v)
				}
			case "NoNewPrivs":
				if v != "1" {
					t.Errorf("thread %s: NoNewPrivs %s, want 1", task.Name(), v)
				}
			}
		}
	}
	if len(tasks) < 2 {
		t.Errorf("the helper has %d threads: the check wants Go's several", len(tasks))
	}
}
