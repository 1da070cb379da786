package spare

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/shimtest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// timeoutEnv sets a spare's idle timeout in tests (the test binary is the spare).
const timeoutEnv = "COCOON_SPARE_TEST_IDLE"

// TestMain makes the test binary a spare when run as one: once handed a
// task it records what it became in its new working dir and serves the task
// socket, as the task server would (shimtest.Serve).
func TestMain(m *testing.M) {
	if len(os.Args) == 2 && os.Args[1] == Flag && os.Getenv(sweepTestEnv) == "1" {
		// TestSweepPools' spare: a spare's command line, until stdin ends.
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
	if len(os.Args) == 3 && os.Args[1] == Flag {
		if d, err := time.ParseDuration(os.Getenv(timeoutEnv)); err == nil {
			IdleTimeout = d
		}
		if err := Wait(os.Args[2], nil); err != nil {
			os.Exit(3)
		}
		shimtest.Serve()
		return
	}
	os.Exit(m.Run())
}

func newFakeContainerd(t *testing.T, dir string) *shimtest.Containerd {
	t.Helper()
	return shimtest.NewContainerd(t, filepath.Join(dir, "ttrpc"))
}

// socketDir is a short dir for sockets (unix socket paths are limited).
func socketDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "cocoon-spare-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// processesNaming lists the pids with s as an argument.
func processesNaming(s string) []int {
	des, _ := os.ReadDir("/proc")
	var pids []int
	for _, de := range des {
		pid, err := strconv.Atoi(de.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", de.Name(), "cmdline"))
		stat, _ := os.ReadFile(filepath.Join("/proc", de.Name(), "stat"))
		zombie := strings.Contains(string(stat), ") Z ")
		if slices.Contains(strings.Split(string(cmdline), "\x00"), s) && !zombie {
			pids = append(pids, pid)
		}
	}
	return pids
}

// refill puts a spare of the test binary in place and waits until it is
// ready at path; it returns its pid, killed at cleanup.
func refill(t *testing.T, dir, containerd string) (path string, pid int) {
	t.Helper()
	paths, pids := refillSlots(t, dir, containerd, 1)
	return paths[0], pids[0]
}

// refillSlots puts spares of the test binary in count slots and waits
// until each is ready; it returns their sockets and pids, killed at
// cleanup.
func refillSlots(t *testing.T, dir, containerd string, count int) (paths []string, pids []int) {
	t.Helper()
	if err := Refill(dir, containerd, os.Args[0], count, os.Environ()); err != nil {
		t.Fatal(err)
	}
	for slot := range count {
		path := Path(dir, containerd, os.Args[0], slot)
		// A spare starts under SCHED_IDLE: on a machine busy with other
		// tests it gets little CPU until it is up.
		testenv.Eventually(t, time.Minute, "the spare at "+path, func() error {
			if !accepts(path) {
				return errors.New("not ready")
			}
			return nil
		})
		found := processesNaming(path)
		if len(found) != 1 {
			t.Fatalf("%d spares at %s, want 1", len(found), path)
		}
		shimtest.KillAtCleanup(t, found[0])
		paths, pids = append(paths, path), append(pids, found[0])
	}
	return paths, pids
}

func awaitGone(t *testing.T, path string) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, "the spare at "+path+" to exit", func() error {
		if len(processesNaming(path)) > 0 {
			return errors.New("still runs")
		}
		return nil
	})
}
