package qemu

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/continuity/fs"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// The guest-side marker: a file in the guest's tmpfs, and a shell that
// holds a counter in its memory only, driven through two FIFOs ("inc"
// bumps it, "get" writes it to the out FIFO). The shell keeps the command
// FIFO open (read-write), so no command is lost between two reads.
const (
	counterStart = `mkfifo /dev/shm/ctl /dev/shm/out || exit 1; (exec 3<>/dev/shm/ctl; n=0; while read cmd <&3; do ` +
		`case $cmd in inc) n=$((n+1));; get) echo $n > /dev/shm/out;; esac; done) </dev/null >/dev/null 2>&1 &`
	counterInc = "echo inc > /dev/shm/ctl"
	counterGet = "echo get > /dev/shm/ctl; cat /dev/shm/out"
	// dirtyEight makes the guest change 8 MiB of fresh RAM (tmpfs pages).
	dirtyEight = "dd if=/dev/urandom of=/dev/shm/dirty bs=1M count=8 2>/dev/null"
	// busyWriter keeps rewriting 1 MiB of tmpfs in the background.
	busyWriter = "(while :; do dd if=/dev/urandom of=/dev/shm/busy bs=64k count=16 2>/dev/null; done) </dev/null >/dev/null 2>&1 &"
)

func sh(t testing.TB, c *agent.Client, script string) string {
	t.Helper()
	return run(t, c, "/bin/sh", "-c", script)
}

func counter(t *testing.T, c *agent.Client) int {
	t.Helper()
	n, err := strconv.Atoi(sh(t, c, counterGet))
	if err != nil {
		t.Fatalf("counter: %v", err)
	}
	return n
}

func randomMark(t *testing.T) string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// dumpMemory writes the paused VM's whole memory to a file, read without
// the driver's page tracking: QEMU's mapping through /proc/PID/mem under
// mmap, the memfd under copy.
func dumpMemory(t *testing.T, v *VM, path string) {
	t.Helper()
	size := v.shape.MemoryBytes
	var src io.ReaderAt
	if v.memPath != "" {
		f, err := os.Open(v.memPath)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		src = f
	} else {
		flat, err := os.Open(v.staged.MemoryPath())
		if err != nil {
			t.Fatal(err)
		}
		defer flat.Close()
		m, err := fileMapping(v.PID(), flat, size)
		if err != nil {
			t.Fatal(err)
		}
		mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", v.PID()))
		if err != nil {
			t.Fatal(err)
		}
		defer mem.Close()
		src = io.NewSectionReader(mem, int64(m.addr), size)
	}
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if _, err := io.Copy(out, io.NewSectionReader(src, 0, size)); err != nil {
		t.Fatalf("dump guest memory: %v", err)
	}
}

func sameFile(t *testing.T, a, b string) bool {
	t.Helper()
	return testenv.DifferingPages(t, a, b) == 0
}

func otherMode(m hypervisor.Mode) hypervisor.Mode {
	if m == hypervisor.ModeMmap {
		return hypervisor.ModeCopy
	}
	return hypervisor.ModeMmap
}

// A diff of a restored VM, taken live while the guest writes memory, holds
// the pages the guest changed (measured here by comparing its whole memory
// at the stop with the staged file) and little else; its device state
// carries no guest RAM; the parent runs on; a clone of the chain + diff, in
// the other mode, has the file and the counter.
func TestForkDiff(t *testing.T) {
	d := newTestDriver(t)
	for _, mode := range []hypervisor.Mode{hypervisor.ModeMmap, hypervisor.ModeCopy} {
		t.Run(string(mode), func(t *testing.T) {
			root := t.TempDir()
			base := bakedLink(t, d)
			s := newStager(t, root, base)
			v, c := restoreReady(t, d, hypervisor.RestoreRequest{StagedDir: s.stage(), RunDir: s.runDir(), Mode: mode})
			if mode == hypervisor.ModeCopy {
				// As restore.Run does once the guest is up.
				os.Remove(v.staged.MemoryPath())
			}
			mark := randomMark(t)
			sh(t, c, "echo "+mark+" > /dev/shm/marker")
			sh(t, c, counterStart)
			for range 3 {
				sh(t, c, counterInc)
			}
			sh(t, c, dirtyEight)
			// The guest keeps writing while the live snapshot streams.
			sh(t, c, busyWriter)

			ctx := testContext(t, 2*time.Minute)
			link := filepath.Join(root, "fork")
			now := filepath.Join(root, "now")
			// SnapshotLive, with the guest's memory dumped where it resumes
			// the guest: what the snapshot must have captured.
			resume := func(ctx context.Context) error {
				dumpMemory(t, v, now)
				return v.Resume(ctx)
			}
			if err := v.snapshot(ctx, link, hypervisor.SnapshotDiff, resume); err != nil {
				t.Fatalf("diff snapshot: %v", err)
			}
			changed := testenv.DifferingPages(t, now, s.flat) * 4096

			l, err := chain.ReadLink(link)
			if err != nil {
				t.Fatal(err)
			}
			top, err := chain.ReadLink(base)
			if err != nil {
				t.Fatal(err)
			}
			if l.Kind != chain.KindDiff || l.Parent != top.ID() {
				t.Fatalf("link is %s on %s, want a diff on %s", l.Kind, l.Parent, top.ID())
			}
			t.Logf("guest changed %d KiB; the diff carries %d KiB", changed>>10, l.Memory.DataBytes>>10)
			if changed < 8<<20 || l.Memory.DataBytes < changed || l.Memory.DataBytes > changed+changed/10 {
				t.Errorf("diff carries %d bytes for %d bytes changed: want at least the change, at most 10%% more, and the change at least 8 MiB", l.Memory.DataBytes, changed)
			}
			checkNoGuestRAM(t, link, l, mode)
			flat := filepath.Join(root, "flat-fork")
			if err := chain.Flatten(ctx, []string{base, link}, flat); err != nil {
				t.Fatal(err)
			}
			if !sameFile(t, flat, now) {
				t.Fatal("flatten of the chain + diff is not the guest's memory at the snapshot")
			}

			sh(t, c, counterInc)
			if n := counter(t, c); n != 4 {
				t.Errorf("parent's counter %d after the fork and one more inc, want 4", n)
			}

			s2 := newStager(t, t.TempDir(), base, link)
			_, c2 := restoreReady(t, d, hypervisor.RestoreRequest{StagedDir: s2.stage(), RunDir: s2.runDir(), Mode: otherMode(mode)})
			if got := sh(t, c2, "cat /dev/shm/marker"); got != mark {
				t.Errorf("clone's marker %q, want %q", got, mark)
			}
			if n := counter(t, c2); n != 3 {
				t.Errorf("clone's counter %d, want the 3 it had at the fork", n)
			}
			if got := sh(t, c, "cat /dev/shm/marker"); got != mark {
				t.Errorf("parent's marker %q after the clone ran, want %q", got, mark)
			}
		})
	}
}

// checkNoGuestRAM checks a link's device state holds no guest RAM: small,
// and parsed, its RAM section has none of the guest RAM block's pages. An
// mmap restore's stream had them, so its link says it was filtered.
func checkNoGuestRAM(t *testing.T, dir string, l *chain.Link, mode hypervisor.Mode) {
	t.Helper()
	state := filepath.Join(dir, StateFile)
	st, err := os.Stat(state)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() > 1<<20 {
		t.Errorf("device state is %d bytes: want well under 1 MiB", st.Size())
	}
	if err := checkState(state, l); err != nil {
		t.Errorf("device state: %v", err)
	}
	want := ""
	if mode == hypervisor.ModeMmap {
		want = chain.StateMemoryFiltered
	}
	if l.StateMemory != want {
		t.Errorf("link stateMemory %q after a %s restore, want %q", l.StateMemory, mode, want)
	}
}

// fullNow writes a full link of the paused VM next to the diff it just
// wrote: the same device state, and every page of its memory now.
func fullNow(t *testing.T, v *VM, diffDir, dir string) {
	t.Helper()
	ctx := testContext(t, time.Minute)
	for _, name := range []string{StateFile, ShapeFile} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := fs.CopyFile(filepath.Join(dir, name), filepath.Join(diffDir, name)); err != nil {
			t.Fatal(err)
		}
	}
	ram, err := v.openRAM(ctx, hypervisor.SnapshotFull)
	if err != nil {
		t.Fatal(err)
	}
	defer ram.Close()
	build, err := v.build(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeFull(ctx, ram, v.shape.MemoryBytes, v.linkMeta(build), dir, nil); err != nil {
		t.Fatalf("full link: %v", err)
	}
}

// Four forks, each of a VM restored from the chain the one before made, in
// alternating modes: each prefix flattens to the memory a full snapshot at
// the same point holds, and the last chain restores with every fork's file
// and the counter.
func TestForkChain(t *testing.T) {
	d := newTestDriver(t)
	links := []string{bakedLink(t, d)}
	ctx := context.Background()
	for k := 1; k <= 4; k++ {
		mode := hypervisor.ModeMmap
		if k%2 == 0 {
			mode = hypervisor.ModeCopy
		}
		root := t.TempDir()
		s := newStager(t, root, links...)
		v, c := restoreReady(t, d, hypervisor.RestoreRequest{StagedDir: s.stage(), RunDir: s.runDir(), Mode: mode})
		if k == 1 {
			sh(t, c, counterStart)
		}
		sh(t, c, fmt.Sprintf("echo %d > /dev/shm/fork%d && %s", k, k, counterInc))
		link, full := filepath.Join(root, "fork"), filepath.Join(root, "full")
		if err := v.Pause(testContext(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
		if err := v.Snapshot(testContext(t, time.Minute), link, hypervisor.SnapshotDiff); err != nil {
			t.Fatalf("fork %d (%s): %v", k, mode, err)
		}
		fullNow(t, v, link, full)
		v.Close()
		links = append(links, link)
		fromChain, fromFull := filepath.Join(root, "flat-chain"), filepath.Join(root, "flat-full")
		if err := chain.Flatten(ctx, links, fromChain); err != nil {
			t.Fatal(err)
		}
		if err := chain.Flatten(ctx, []string{full}, fromFull); err != nil {
			t.Fatal(err)
		}
		if !sameFile(t, fromChain, fromFull) {
			t.Fatalf("fork %d: the chain of %d links flattens to other memory than a full snapshot at the same point", k, len(links))
		}
	}
	s := newStager(t, t.TempDir(), links...)
	_, c := restoreReady(t, d, hypervisor.RestoreRequest{StagedDir: s.stage(), RunDir: s.runDir(), Mode: hypervisor.ModeMmap})
	if got := sh(t, c, "cat /dev/shm/fork1 /dev/shm/fork2 /dev/shm/fork3 /dev/shm/fork4 | tr '\\n' ' '"); got != "1 2 3 4" {
		t.Errorf("the last fork's files say %q, want 1 2 3 4", got)
	}
	if n := counter(t, c); n != 4 {
		t.Errorf("counter %d after four forks, want 4", n)
	}
}

// SnapshotLive leaves the VM running, whether the snapshot was written or
// failed: before the guest stopped (no snapshot directory) or after (the
// directory already holds a link, which the link writer refuses once the
// device state is saved).
func TestSnapshotLiveLeavesRunning(t *testing.T) {
	d := newTestDriver(t)
	root := t.TempDir()
	s := newStager(t, root, bakeBare(t, d, root))
	ctx := testContext(t, time.Minute)
	hv, err := d.Restore(ctx, hypervisor.RestoreRequest{StagedDir: s.stage(), RunDir: s.runDir(), Mode: hypervisor.ModeMmap})
	if err != nil {
		t.Fatal(err)
	}
	v := hv.(*VM)
	closeVM(t, v)
	if err := v.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	// The link writer fails once the guest has stopped: memory.data is taken.
	blocked := filepath.Join(root, "blocked")
	if err := os.MkdirAll(filepath.Join(blocked, chain.DataFile), 0o755); err != nil {
		t.Fatal(err)
	}
	// A link already there is refused before anything is written into it.
	held := filepath.Join(root, "held")
	if err := os.Mkdir(held, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{chain.LinkFile, StateFile} {
		if err := os.WriteFile(filepath.Join(held, name), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		dir     string
		kind    hypervisor.SnapshotKind
		wantErr string // "" for success
	}{
		{filepath.Join(root, "live"), hypervisor.SnapshotDiff, ""},
		{"/proc/version/live", hypervisor.SnapshotDiff, "create snapshot dir"},
		{blocked, hypervisor.SnapshotFull, "is a directory"},
		{held, hypervisor.SnapshotFull, "already holds a link"},
		{filepath.Join(root, "live2"), hypervisor.SnapshotDiff, ""},
	} {
		err := v.SnapshotLive(ctx, tt.dir, tt.kind)
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Fatalf("%s live snapshot into %s: %v, want an error containing %q", tt.kind, tt.dir, err, tt.wantErr)
		}
		var st struct {
			Status string `json:"status"`
		}
		if err := v.qmp.Execute(ctx, "query-status", nil, &st); err != nil || st.Status != "running" {
			t.Fatalf("after a %s live snapshot into %s: status %q (%v), want running", tt.kind, tt.dir, st.Status, err)
		}
	}
	if _, err := chain.ReadLink(filepath.Join(root, "live2")); err != nil {
		t.Errorf("second live snapshot of a VM: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(held, StateFile)); err != nil || string(b) != "{}" {
		t.Errorf("the existing link's state file after a refused snapshot: %q, %v; want it untouched", b, err)
	}
}
