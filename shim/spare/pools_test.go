package spare

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
)

// sweepTestEnv has the test binary wait as a spare would (TestMain).
const sweepTestEnv = "COCOON_SWEEP_TEST_SPARE"

// TestSweepPools: the run dirs of pooled VMs whose spare is gone, or is
// this process (an older one of its pid), go; a running spare's stays, as
// does anything else.
func TestSweepPools(t *testing.T) {
	// A spare's command line, the flag first: this test binary, which
	// TestMain has wait on its stdin.
	live := exec.Command(os.Args[0], Flag)
	live.Env = append(os.Environ(), sweepTestEnv+"=1")
	stdin, err := live.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); _ = live.Wait() })
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	parent := t.TempDir()
	names := map[string]bool{ // name: kept
		PoolPrefix + strconv.Itoa(live.Process.Pid): true,
		PoolPrefix + strconv.Itoa(gone.Process.Pid): false,
		PoolPrefix + strconv.Itoa(os.Getpid()):      false,
		PoolPrefix + strconv.Itoa(os.Getppid()):     false, // running, but no spare
		PoolPrefix + "warm":                         true,
		"c1":                                        true,
	}
	var want []string
	for name, kept := range names {
		if err := os.Mkdir(filepath.Join(parent, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if kept {
			want = append(want, name)
		}
	}
	if err := SweepPools(parent); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(parent)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("left %v, want %v", got, want)
	}
}
