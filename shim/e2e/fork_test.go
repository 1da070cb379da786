package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/ctrdtest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// The marker a forked task carries: a file in the guest's tmpfs and a shell
// holding a counter in its memory only ("inc" bumps it, "get" prints it
// through a second FIFO). The shell keeps the command FIFO open read-write,
// so no command is lost.
const (
	counterStart = `mkfifo /dev/shm/ctl /dev/shm/out || exit 1; (exec 3<>/dev/shm/ctl; n=0; while read cmd <&3; do ` +
		`case $cmd in inc) n=$((n+1));; get) echo $n > /dev/shm/out;; esac; done) </dev/null >/dev/null 2>&1 &`
	counterInc = "echo inc > /dev/shm/ctl"
	counterGet = "echo get > /dev/shm/ctl; cat /dev/shm/out"
	// readMarker prints the marker file and the counter.
	readMarker = "cat /dev/shm/marker; " + counterGet
)

// forkStack is a stack whose config lets a task choose its restore mode.
func forkStack(t *testing.T) *ctrdtest.Containerd {
	return stack(t, "[restore]\nallow_annotation = true\n")
}

func modeFlags(mode string) []string {
	return []string{"--annotation", "io.cocoon.restore-mode=" + mode}
}

// cocoonctl runs bin/cocoonctl SUBCOMMAND against c's containerd.
func cocoonctl(t *testing.T, c *ctrdtest.Containerd, sub string, args ...string) (string, error) {
	t.Helper()
	argv := append([]string{sub, "--address", c.Address, "--namespace", ctrdtest.Namespace}, args...)
	out, err := exec.Command(testenv.Bin(t, "cocoonctl"), argv...).CombinedOutput()
	return string(out), err
}

func execSh(t *testing.T, c *ctrdtest.Containerd, id, script string) string {
	t.Helper()
	out, err := c.Ctr("task", "exec", "--exec-id", "x"+randomHex(4), "--fifo-dir", c.FifoDir, id, "sh", "-c", script)
	if err != nil {
		t.Fatalf("exec in %s: %v\n%s", id, err, out)
	}
	return strings.TrimSpace(out)
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// runImage is `ctr run --rm` of image with the cocoon runtime.
func runImage(c *ctrdtest.Containerd, flags []string, image, id string, args ...string) (string, error) {
	argv := append([]string{"run", "--rm", "--runtime", runtimeName, "--snapshotter", ctrdtest.Snapshotter, "--fifo-dir", c.FifoDir}, flags...)
	return c.Ctr(append(append(argv, image, id), args...)...)
}

// startMarked runs a task in mode and leaves the marker in it, the counter
// at 3. It returns the marker.
func startMarked(t *testing.T, c *ctrdtest.Containerd, id, mode string) string {
	t.Helper()
	if _, err := run(c, append([]string{"-d"}, modeFlags(mode)...), id, "sleep", "3600"); err != nil {
		t.Fatal(err)
	}
	mark := randomHex(8)
	execSh(t, c, id, "echo "+mark+" > /dev/shm/marker")
	execSh(t, c, id, counterStart)
	for range 3 {
		execSh(t, c, id, counterInc)
	}
	return mark
}

// imageNames lists the images in the store.
func imageNames(t *testing.T, c *ctrdtest.Containerd) string {
	t.Helper()
	out, err := c.Ctr("images", "ls", "-q")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

// TestFork forks a task restored with mmap and one restored with copy: a
// clone run from each fork image (in the other mode) has the file and the
// counter, the parent runs on, the image exports as a valid chain archive
// that names its parent's layers, and a fork of a fork chains on.
func TestFork(t *testing.T) {
	c := forkStack(t)
	for _, mode := range []string{"mmap", "copy"} {
		t.Run(mode, func(t *testing.T) {
			parent, image := "p-"+mode, "example.com/cocoon/fork-"+mode+":1"
			mark := startMarked(t, c, parent, mode)
			out, err := cocoonctl(t, c, "fork", "--image", image, parent)
			if err != nil {
				t.Fatalf("cocoonctl fork: %v\n%s", err, out)
			}
			t.Log(strings.TrimSpace(out))
			// The node has the parent flattened (the parent runs on it): the
			// clone restores from that file and the fork's pages.
			other, clone := map[string]string{"mmap": "copy", "copy": "mmap"}[mode], "c-"+mode
			if out, err := c.Ctr(append(append([]string{"run", "-d", "--runtime", runtimeName, "--snapshotter", ctrdtest.Snapshotter, "--fifo-dir", c.FifoDir}, modeFlags(other)...), image, clone, "sleep", "3600")...); err != nil {
				t.Fatalf("run the fork image: %v\n%s", err, out)
			}
			report := readReport(t, c, clone)
			if reasons := strings.Join(report.Plan.Reasons, "\n"); !strings.Contains(reasons, "memory: the staged file holds links 1-1 and the restore writes the top 1 into the guest") ||
				!strings.Contains(phaseList(report.Phases), "delta=") {
				t.Errorf("clone's restore report: reasons\n%s\nphases %s\nwant the fork's pages written into the guest", reasons, phaseList(report.Phases))
			}
			if got, want := execSh(t, c, clone, readMarker), mark+"\n3"; got != want {
				t.Errorf("clone of the fork prints %q, want %q (marker and counter)", got, want)
			}
			execSh(t, c, parent, counterInc)
			if got, want := execSh(t, c, parent, readMarker), mark+"\n4"; got != want {
				t.Errorf("parent prints %q after the fork and one more inc, want %q", got, want)
			}
			checkExport(t, c, image, 2)
		})
	}
	// A fork of a task run from a fork image is a third link.
	if _, err := run2(c, "example.com/cocoon/fork-mmap:1", "ff"); err != nil {
		t.Fatal(err)
	}
	execSh(t, c, "ff", counterInc)
	if out, err := cocoonctl(t, c, "fork", "--image", "example.com/cocoon/fork2:1", "ff"); err != nil {
		t.Fatalf("fork of a fork: %v\n%s", err, out)
	}
	got, err := runImage(c, nil, "example.com/cocoon/fork2:1", "c-ff", "sh", "-c", counterGet)
	if err != nil || strings.TrimSpace(got) != "4" {
		t.Fatalf("clone of the fork of a fork prints %q (%v), want the counter 4", got, err)
	}
	checkExport(t, c, "example.com/cocoon/fork2:1", 3)
}

// run2 starts a detached task of image.
func run2(c *ctrdtest.Containerd, image, id string) (string, error) {
	return c.Ctr("run", "-d", "--runtime", runtimeName, "--snapshotter", ctrdtest.Snapshotter, "--fifo-dir", c.FifoDir, image, id, "sleep", "3600")
}

// checkExport exports image and reads the archive as a chain of n links,
// the fork's layers being its parent's but the last.
func checkExport(t *testing.T, c *ctrdtest.Containerd, image string, n int) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "fork.tar")
	if out, err := c.Ctr("images", "export", file, image); err != nil {
		t.Fatalf("ctr images export %s: %v\n%s", image, err, out)
	}
	a, err := chain.ReadArchive(file)
	if err != nil {
		t.Fatalf("exported fork image: %v", err)
	}
	base, err := chain.ReadArchive(bakeArchive)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Links) != n || a.Manifest.Layers[0].Digest != base.Manifest.Layers[0].Digest || a.Links[n-1].Kind != chain.KindDiff {
		t.Fatalf("exported fork image has %d links (want %d), first layer %s (want the base's %s), top a %s",
			len(a.Links), n, a.Manifest.Layers[0].Digest, base.Manifest.Layers[0].Digest, a.Links[n-1].Kind)
	}
}

// TestForkRefusals: unknown, paused and exited tasks, and a task whose
// image no longer is the chain it was restored from, are refused with a
// clear error; the task is as it was and no image is made.
func TestForkRefusals(t *testing.T) {
	c := forkStack(t)
	if _, err := run(c, []string{"-d"}, "paused", "sleep", "3600"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Ctr("task", "pause", "paused"); err != nil {
		t.Fatal(err)
	}
	if out, err := run(c, []string{"-d"}, "exited", "true"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	waitStatus(t, c, "exited", "STOPPED")
	// A task of an alias whose name then moves to another chain (base + a
	// fork of the task): its diff's parent is no longer the image's top link.
	alias := "example.com/cocoon/alias:1"
	if _, err := c.Ctr("images", "tag", imageRef, alias); err != nil {
		t.Fatal(err)
	}
	if _, err := run2(c, alias, "moved"); err != nil {
		t.Fatal(err)
	}
	if out, err := cocoonctl(t, c, "fork", "--image", "example.com/cocoon/moved-base:1", "moved"); err != nil {
		t.Fatalf("fork: %v\n%s", err, out)
	}
	if _, err := c.Ctr("images", "tag", "--force", "example.com/cocoon/moved-base:1", alias); err != nil {
		t.Fatal(err)
	}
	before := imageNames(t, c)
	tests := []struct{ task, want, status string }{
		{"nosuch", `no container "nosuch"`, ""},
		{"paused", "is paused: resume it", "PAUSED"},
		{"exited", "is stopped, want running", "STOPPED"},
		{"moved", "parent digest mismatch", "RUNNING"},
	}
	for _, tt := range tests {
		t.Run(tt.task, func(t *testing.T) {
			image := "example.com/cocoon/refused-" + tt.task + ":1"
			out, err := cocoonctl(t, c, "fork", "--image", image, tt.task)
			if err == nil || !strings.Contains(out, tt.want) {
				t.Fatalf("fork of %s: %v\n%s\nwant an error containing %q", tt.task, err, out, tt.want)
			}
			if tt.status != "" {
				if _, st := taskPID(t, c, tt.task); st != tt.status {
					t.Errorf("task %s is %s after the refused fork, want %s", tt.task, st, tt.status)
				}
			}
			if after := imageNames(t, c); after != before {
				t.Errorf("images after a refused fork:\n%s\nbefore:\n%s", after, before)
			}
		})
	}
	if got := execSh(t, c, "moved", "echo still-here"); got != "still-here" {
		t.Errorf("task after the refused fork answers %q", got)
	}
	if out, err := c.Ctr("leases", "ls", "-q"); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("leases left after the forks: %q (%v)", out, err)
	}
}

// TestHibernate hibernates a task and runs its image later: the process
// state is back (file, counter), and the clock is the host's again.
func TestHibernate(t *testing.T) {
	c := forkStack(t)
	mark := startMarked(t, c, "h1", "mmap")
	image := "example.com/cocoon/hibernated:1"
	if out, err := cocoonctl(t, c, "hibernate", "--image", image, "h1"); err != nil {
		t.Fatalf("cocoonctl hibernate: %v\n%s", err, out)
	}
	if _, st := taskPID(t, c, "h1"); st != "STOPPED" {
		t.Fatalf("hibernated task is %s, want STOPPED", st)
	}
	time.Sleep(2 * time.Second) // the guest clock must move on while it sleeps
	before := time.Now().Unix()
	out, err := runImage(c, nil, image, "h2", "sh", "-c", readMarker+"; date +%s")
	after := time.Now().Unix()
	if err != nil {
		t.Fatalf("run the hibernated image: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || lines[0] != mark || lines[1] != "3" {
		t.Fatalf("woken task prints %q, want the marker %s, the counter 3 and the date", out, mark)
	}
	guest, err := strconv.ParseInt(lines[2], 10, 64)
	if err != nil || guest < before-1 || guest > after+1 {
		t.Errorf("woken guest's clock %s, want between %d and %d (%v)", lines[2], before, after, err)
	}
}
