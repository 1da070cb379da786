package agent_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
)

// hugeArgs is how many 100 kB arguments a huge command line has: 1.9 MB,
// under the kernel's 2 MiB for a command line and environment, and each
// under its 128 KiB for one argument. Three such processes list to more
// than ttrpc's 4 MiB message.
const hugeArgs = 19

// testHugeCommandLines runs processes with 1.9 MB command lines, as any
// guest user can: the process list still answers, with their commands cut
// and marked so, and the session lives on for kill and exec.
func testHugeCommandLines(t *testing.T, tg *target) {
	ctx := ctxT(t)
	huge := startHuge(t, tg, 3)
	procs, err := tg.c.Processes(ctx)
	if err != nil {
		t.Fatalf("process list with huge command lines: %v", err)
	}
	listed := 0
	for _, p := range procs.Processes {
		if len(p.Command) > 4<<10 {
			t.Errorf("process %d listed with a command of %d bytes", p.Pid, len(p.Command))
		}
		if isHuge(p, huge) {
			listed++
		}
	}
	if listed != len(huge) {
		t.Errorf("%d of the %d huge processes listed with their commands cut and marked so", listed, len(huge))
	}
	for _, p := range huge {
		if err := tg.c.Signal(ctx, p.ID, syscall.SIGKILL); err != nil {
			t.Fatalf("kill after the process list: %v", err)
		}
		if st, err := tg.c.Wait(ctx, p.ID); err != nil || st.Signal != int(syscall.SIGKILL) {
			t.Errorf("wait for %s: %+v %v, want killed", p.ID, st, err)
		}
	}
	res := run(t, tg.c, agent.ExecRequest{ID: procID(t) + "-after", Args: []string{"echo", "alive"}}, "")
	if res.stdout != "alive\n" || res.status.Code != 0 {
		t.Errorf("exec after the process list: %q %q %+v", res.stdout, res.stderr, res.status)
	}
}

// startHuge starts n processes with huge command lines and returns once
// each shows it. Each leads its own process group (the agent starts it in
// a new session), which the cleanup kills: the sleep in it outlives it.
func startHuge(t *testing.T, tg *target, n int) []*agent.Process {
	t.Helper()
	ctx := ctxT(t)
	// The inner sh holds the huge command line; "; :" keeps it from
	// exec'ing sleep, which would replace it.
	script := "a=$(head -c 100000 /dev/zero | tr '\\0' a); exec sh -c 'sleep 300; :' huge" + strings.Repeat(" $a", hugeArgs)
	var huge []*agent.Process
	var groups, ready string
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if p, err := tg.c.Exec(ctx, agent.ExecRequest{ID: procID(t) + "-cleanup", Args: []string{"sh", "-c", "kill -KILL" + groups}}); err == nil {
			_, _ = tg.c.Wait(ctx, p.ID)
		}
	})
	for i := range n {
		p, err := tg.c.Exec(ctx, agent.ExecRequest{ID: fmt.Sprintf("%s-%d", procID(t), i), Args: []string{"sh", "-c", script}})
		if err != nil {
			t.Fatal(err)
		}
		huge = append(huge, p)
		pid := strconv.FormatUint(uint64(p.Pid), 10)
		groups += " -" + pid
		ready += fmt.Sprintf("until [ $(wc -c </proc/%s/cmdline) -gt 1000000 ]; do sleep 0.1; done; ", pid)
	}
	res := run(t, tg.c, agent.ExecRequest{ID: procID(t) + "-ready", Args: []string{"sh", "-c", ready}}, "")
	if res.status.Code != 0 {
		t.Fatalf("wait for the huge command lines: %q %+v", res.stderr, res.status)
	}
	return huge
}

func isHuge(p agent.ProcessInfo, huge []*agent.Process) bool {
	for _, h := range huge {
		if p.Pid == h.Pid && p.ID == h.ID {
			return p.CommandTruncated && strings.HasPrefix(p.Command, "sh -c sleep 300; : huge aaaa")
		}
	}
	return false
}
