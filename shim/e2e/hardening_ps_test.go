package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/ctrdtest"
)

// psTimeout bounds each ctr call of TestPsHugeCommandLines: the agent's
// calls answer within the shim's call timeout (10 s by default) or fail.
const psTimeout = 2 * time.Minute

// hugeProcs starts three guest processes with 1.9 MB command lines (19
// arguments of 100 kB: the kernel allows 2 MiB for all, 128 KiB for one),
// more than ttrpc's 4 MiB message together, and waits until they show.
const hugeProcs = `a=$(head -c 100000 /dev/zero | tr '\0' a)
for i in 1 2 3; do sh -c 'sleep 600; :' huge` + " $a $a $a $a $a $a $a $a $a $a $a $a $a $a $a $a $a $a $a" + ` >/dev/null 2>&1 & done
until [ $(cat /proc/[0-9]*/cmdline 2>/dev/null | wc -c) -gt 5700000 ]; do sleep 0.2; done
echo ready`

// TestPsHugeCommandLines: guest processes with huge command lines, which
// any guest user can start, do not cut the host off from its VM: ctr task
// ps answers, and ctr task exec and ctr task kill (SIGTERM, which only the
// guest agent can deliver) work afterwards. The agent's unbounded process
// list used to exceed ttrpc's message limit, which ended the host's
// session for good.
func TestPsHugeCommandLines(t *testing.T) {
	c := stack(t, "")
	if _, err := run(c, []string{"-d"}, "ps1", "sleep", "600"); err != nil {
		t.Fatal(err)
	}
	if out := execSh(t, c, "ps1", hugeProcs); out != "ready" {
		t.Fatalf("start the huge processes: %q", out)
	}
	out, err := ctrWithin(c, "task", "ps", "ps1")
	if err != nil {
		t.Fatalf("ctr task ps with huge guest command lines: %v\n%s", err, out)
	}
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) < 5 {
		t.Errorf("ctr task ps lists %d lines, want a header, sleep 600 and the three huge processes:\n%s", len(lines), out)
	}
	if out := execSh(t, c, "ps1", "echo after-ps"); out != "after-ps" {
		t.Errorf("ctr task exec after ctr task ps: %q", out)
	}
	if out, err := ctrWithin(c, "task", "kill", "ps1"); err != nil {
		t.Fatalf("ctr task kill after ctr task ps: %v\n%s", err, out)
	}
	waitStatus(t, c, "ps1", "STOPPED")
	for _, args := range [][]string{{"task", "delete", "ps1"}, {"container", "rm", "ps1"}} {
		if out, err := ctrWithin(c, args...); err != nil {
			t.Fatalf("ctr %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// ctrWithin is c.Ctr bounded by psTimeout.
func ctrWithin(c *ctrdtest.Containerd, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), psTimeout)
	defer cancel()
	return c.Stack.Ctr(ctx, args...)
}
