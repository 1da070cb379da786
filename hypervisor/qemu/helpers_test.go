package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// testMemory keeps test VMs within the project's 512 MiB per VM budget.
const testMemory = 256 << 20

func newTestDriver(t testing.TB) *Driver {
	t.Helper()
	cfg := config.Default().QEMU
	cfg.Binary = testenv.QEMU(t)
	return New(cfg)
}

func testContext(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// closeVM closes v at the end of the test, and checks nothing is left.
func closeVM(t testing.TB, v *VM) {
	t.Cleanup(func() {
		if err := v.Close(); err != nil {
			t.Errorf("close vm: %v", err)
		}
		assertGone(t, v.PID(), v.RunDir())
	})
}

// bakeBare snapshots a VM that booted no kernel: the firmware finds nothing
// to boot and idles. Enough for tests of the device-state path and its
// failures, without the guest build or a 3 s boot.
func bakeBare(t testing.TB, d *Driver, root string) string {
	t.Helper()
	ctx := testContext(t, time.Minute)
	v, err := d.Boot(ctx, BootSpec{MemoryBytes: testMemory, VCPUs: 1, RunDir: filepath.Join(root, "bake")})
	if err != nil {
		t.Fatalf("boot: %v", err)
	}
	closeVM(t, v)
	link := filepath.Join(root, "link")
	if err := v.Snapshot(ctx, link, hypervisor.SnapshotFull); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	return link
}

// stager plays the snapshotter: one flat memory file per chain, staged by
// hard link into a fresh directory per restore.
type stager struct {
	t     testing.TB
	root  string
	links []string
	flat  string
	n     int
	// covers is how many links flat holds; the others are staged as
	// deltas. Zero means all.
	covers int
	// edit, if set, changes the top link as chain.json describes it.
	edit func(*chain.Link)
}

func newStager(t testing.TB, root string, links ...string) *stager {
	return newDeltaStager(t, root, len(links), links...)
}

// newDeltaStager stages a flat file of the first covers links, and the
// others' memory files as deltas, as the snapshotter does on a node that
// has the prefix flattened.
func newDeltaStager(t testing.TB, root string, covers int, links ...string) *stager {
	t.Helper()
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	flat := filepath.Join(root, "flat")
	if err := chain.Flatten(context.Background(), links[:covers], flat); err != nil {
		t.Fatalf("flatten: %v", err)
	}
	return &stager{t: t, root: root, links: links, flat: flat, covers: covers}
}

func (s *stager) stage() string {
	s.t.Helper()
	s.n++
	dir := filepath.Join(s.root, fmt.Sprintf("staged%d", s.n))
	if err := os.Mkdir(dir, 0o755); err != nil {
		s.t.Fatal(err)
	}
	var links []*chain.Link
	for _, d := range s.links {
		l, err := chain.ReadLink(d)
		if err != nil {
			s.t.Fatal(err)
		}
		links = append(links, l)
	}
	top, topDir := links[len(links)-1], s.links[len(s.links)-1]
	if s.edit != nil {
		s.edit(top)
	}
	for _, name := range top.StateFiles {
		b, err := os.ReadFile(filepath.Join(topDir, name))
		if err != nil {
			s.t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			s.t.Fatal(err)
		}
	}
	if err := os.Link(s.flat, filepath.Join(dir, chain.StagedMemory)); err != nil {
		s.t.Fatal(err)
	}
	for i := s.covers; i < len(links); i++ {
		ext, data := chain.DeltaNames(i)
		for src, dst := range map[string]string{chain.ExtentsFile: ext, chain.DataFile: data} {
			if err := os.Link(filepath.Join(s.links[i], src), filepath.Join(dir, dst)); err != nil {
				s.t.Fatal(err)
			}
		}
	}
	if err := chain.WriteStagedMemory(dir, links, chain.StagedMemoryInfo{Covers: s.covers}); err != nil {
		s.t.Fatal(err)
	}
	return dir
}

func (s *stager) runDir() string {
	return filepath.Join(s.root, fmt.Sprintf("run%d", s.n))
}

// assertGone checks that pid no longer exists (reaped, not a zombie) and
// that runDir was removed.
func assertGone(t testing.TB, pid int, runDir string) {
	t.Helper()
	if pid > 0 {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("process %d still exists (kill 0: %v)", pid, err)
		}
	}
	if _, err := os.Stat(runDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("run dir %s still exists (%v)", runDir, err)
	}
}

// pidUsing finds a process of ours whose command line mentions s.
func pidUsing(s string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if strings.Contains(string(cmdline), s) {
			return pid
		}
	}
	return 0
}

// numberedPages is n pages of size page, page i filled with byte i.
func numberedPages(n, page int) []byte {
	b := make([]byte, n*page)
	for i := range b {
		b[i] = byte(i / page)
	}
	return b
}
