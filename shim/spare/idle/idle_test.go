package idle

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// reportEnv has the test binary, run by TestSpareStartsIdle, report the
// scheduling policy of each of its threads as this package's init left
// them, instead of running the tests.
const reportEnv = "COCOON_IDLE_TEST_REPORT"

func TestMain(m *testing.M) {
	if os.Getenv(reportEnv) == "1" {
		fmt.Print(policies())
		return
	}
	os.Exit(m.Run())
}

// policies lists the policy of every thread of this process.
func policies() string {
	des, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return "error: " + err.Error()
	}
	var out []string
	for _, de := range des {
		tid, _ := strconv.Atoi(de.Name())
		p, _, errno := syscall.RawSyscall(syscall.SYS_SCHED_GETSCHEDULER, uintptr(tid), 0, 0)
		if errno != 0 {
			continue
		}
		out = append(out, strconv.Itoa(int(p)))
	}
	return strings.Join(out, " ")
}

func TestSpareStartsIdle(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  string
		want string // every thread's policy: 5 SCHED_IDLE, 0 SCHED_OTHER
	}{
		{"spare asked to idle", []string{Flag, "/nowhere"}, Env + "=1", "5"},
		{"spare not asked", []string{Flag, "/nowhere"}, "", "0"},
		{"not a spare", []string{Flag}, Env + "=1", "0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], tc.args...)
			cmd.Env = append(os.Environ(), reportEnv+"=1", tc.env)
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("run the spare: %v", err)
			}
			fields := strings.Fields(string(out))
			if len(fields) == 0 {
				t.Fatalf("no threads reported: %q", out)
			}
			for _, f := range fields {
				if f != tc.want {
					t.Fatalf("thread policies %q, want all %s", out, tc.want)
				}
			}
		})
	}
}
