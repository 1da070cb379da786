package qemu

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// dirtyGuestMemory makes the guest write 32 MiB of fresh RAM (tmpfs).
const dirtyGuestMemory = "dd if=/dev/urandom of=/dev/shm/dirty bs=1M count=32 2>/dev/null && sync"

func fileSHA256(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}

func TestRestoreMmapMapsStagedFile(t *testing.T) {
	d := newTestDriver(t)
	root := t.TempDir()
	s := newStager(t, root, bakedLink(t, d))
	staged := s.stage()
	before := fileSHA256(t, s.flat)
	v, c := restoreReady(t, d, hypervisor.RestoreRequest{StagedDir: staged, RunDir: s.runDir(), Mode: hypervisor.ModeMmap})

	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", v.PID()))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(maps), filepath.Join(staged, "memory")) {
		t.Fatalf("/proc/%d/maps does not map %s/memory", v.PID(), staged)
	}
	run(t, c, "/bin/sh", "-c", dirtyGuestMemory)
	if err := v.Pause(testContext(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if after := fileSHA256(t, s.flat); after != before {
		t.Fatalf("staged memory changed under an mmap restore: sha256 %s, was %s", after, before)
	}
}

// A copy restore leaves the staged memory to its caller, and the VM it
// returns runs without it: restore.Run unlinks it once the guest is up.
func TestRestoreCopyNeedsNoStagedFile(t *testing.T) {
	d := newTestDriver(t)
	root := t.TempDir()
	s := newStager(t, root, bakedLink(t, d))
	staged := s.stage()
	var phases []string
	req := hypervisor.RestoreRequest{StagedDir: staged, RunDir: s.runDir(), Mode: hypervisor.ModeCopy,
		OnPhase: func(p string, _ time.Duration) { phases = append(phases, p) }}
	ctx := testContext(t, time.Minute)
	hv, err := d.Restore(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	v := hv.(*VM)
	closeVM(t, v)
	mem := filepath.Join(staged, chain.StagedMemory)
	if _, err := os.Stat(mem); err != nil {
		t.Fatalf("the driver removed the staged memory, which is the caller's: %v", err)
	}
	if err := os.Remove(mem); err != nil {
		t.Fatal(err)
	}
	if want := "fill,spawn,load"; strings.Join(phases, ",") != want {
		t.Errorf("phases %v, want %s", phases, want)
	}
	if err := v.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := agent.WaitReady(ctx, v.DialAgent)
	if err != nil {
		t.Fatalf("agent after copy restore: %v", err)
	}
	defer c.Close()
	run(t, c, "/bin/sh", "-c", dirtyGuestMemory)
	if got := run(t, c, "/bin/sh", "-c", "wc -c < /dev/shm/dirty"); got != strconv.Itoa(32<<20) {
		t.Fatalf("guest file size %q after writing 32 MiB", got)
	}
}

// Clones of one snapshot must not share hostname, clock or randomness once
// the agent's Init has run in each.
func TestClonesGetOwnIdentity(t *testing.T) {
	d := newTestDriver(t)
	root := t.TempDir()
	s := newStager(t, root, bakedLink(t, d))
	type clone struct{ hostname, random string }
	var clones []clone
	for i := range 2 {
		_, c := restoreReady(t, d, hypervisor.RestoreRequest{StagedDir: s.stage(), RunDir: s.runDir(), Mode: hypervisor.ModeMmap})
		entropy := make([]byte, 64)
		rand.Read(entropy)
		name := fmt.Sprintf("clone-%d", i)
		if _, err := c.Init(testContext(t, 10*time.Second), agent.InitRequest{Time: time.Now(), Entropy: entropy, Hostname: name}); err != nil {
			t.Fatalf("init %s: %v", name, err)
		}
		host := float64(time.Now().UnixNano()) / 1e9
		guest := guestClock(t, c)
		if skew := math.Abs(guest - host); skew > 1 {
			t.Errorf("%s: guest clock %.3f is %.3fs from the host's", name, guest, skew)
		}
		clones = append(clones, clone{
			hostname: run(t, c, "hostname"),
			random:   run(t, c, "/bin/sh", "-c", "head -c 16 /dev/urandom | od -An -tx1"),
		})
		if clones[i].hostname != name {
			t.Errorf("hostname %q, want %q", clones[i].hostname, name)
		}
	}
	if clones[0].random == clones[1].random {
		t.Errorf("both clones read %s from /dev/urandom", clones[0].random)
	}
}

func TestAgentNeverAnswers(t *testing.T) {
	d := newTestDriver(t)
	root := t.TempDir()
	s := newStager(t, root, bakeBare(t, d, root))
	ctx := testContext(t, 30*time.Second)
	hv, err := d.Restore(ctx, hypervisor.RestoreRequest{StagedDir: s.stage(), RunDir: s.runDir(), Mode: hypervisor.ModeCopy})
	if err != nil {
		t.Fatal(err)
	}
	v := hv.(*VM)
	if err := v.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	// Only the context ends the wait: a guest without an agent never
	// answers, and the VM is still running.
	c, err := agent.WaitReady(testContext(t, time.Second), v.DialAgent)
	if err == nil {
		c.Close()
		t.Fatal("an agent answered in a guest that has none")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitReady: %v, want it ended by its context's deadline", err)
	}
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	assertGone(t, v.PID(), v.RunDir())
}

// guestClock reads the guest's wall clock to the microsecond (busybox date
// has no %N; adjtimex prints tv_sec and tv_usec).
func guestClock(t *testing.T, c *agent.Client) float64 {
	t.Helper()
	var sec, usec float64
	for _, line := range strings.Split(run(t, c, "adjtimex"), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "time.tv_sec:":
			sec = v
		case "time.tv_usec:":
			usec = v
		}
		if err != nil {
			t.Fatalf("adjtimex line %q: %v", line, err)
		}
	}
	if sec == 0 {
		t.Fatal("adjtimex printed no time.tv_sec")
	}
	return sec + usec/1e6
}

// A copy-restored VM keeps its RAM in a memfd the driver holds, so it can
// be snapshotted again (a checkpoint), and the new link restores.
func TestSnapshotOfCopyRestore(t *testing.T) {
	d := newTestDriver(t)
	root := t.TempDir()
	s := newStager(t, root, bakedLink(t, d))
	staged := s.stage()
	v, c := restoreReady(t, d, hypervisor.RestoreRequest{StagedDir: staged, RunDir: s.runDir(), Mode: hypervisor.ModeCopy})
	// As restore.Run does: the checkpoint must read the memfd, not the file.
	if err := os.Remove(filepath.Join(staged, chain.StagedMemory)); err != nil {
		t.Fatal(err)
	}
	run(t, c, "/bin/sh", "-c", "echo checkpointed > /run/mark")
	c.Close()
	link := filepath.Join(root, "checkpoint")
	if err := v.Snapshot(testContext(t, time.Minute), link, hypervisor.SnapshotFull); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	s2 := newStager(t, t.TempDir(), link)
	_, c2 := restoreReady(t, d, hypervisor.RestoreRequest{StagedDir: s2.stage(), RunDir: s2.runDir(), Mode: hypervisor.ModeMmap})
	if got := run(t, c2, "cat", "/run/mark"); got != "checkpointed" {
		t.Fatalf("restored checkpoint has %q in /run/mark", got)
	}
}

// A checkpoint of a restored VM describes the guest its chain described,
// not a default one: the restore policy reads these fields.
func TestSnapshotKeepsGuestMeta(t *testing.T) {
	d := newTestDriver(t)
	root := t.TempDir()
	s := newStager(t, root, bakeBare(t, d, root))
	s.edit = func(l *chain.Link) { l.GuestOS, l.HugePages, l.SharedMemory = "windows", true, true }
	ctx := testContext(t, time.Minute)
	hv, err := d.Restore(ctx, hypervisor.RestoreRequest{StagedDir: s.stage(), RunDir: s.runDir(), Mode: hypervisor.ModeCopy})
	if err != nil {
		t.Fatal(err)
	}
	v := hv.(*VM)
	closeVM(t, v)
	link := filepath.Join(root, "checkpoint")
	if err := v.Snapshot(ctx, link, hypervisor.SnapshotFull); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	l, err := chain.ReadLink(link)
	if err != nil {
		t.Fatal(err)
	}
	if l.GuestOS != "windows" || !l.HugePages || !l.SharedMemory || l.Hypervisor != Name {
		t.Errorf("checkpoint link: guest %q, hugepages %v, shared %v, hypervisor %q; want windows, true, true, %s",
			l.GuestOS, l.HugePages, l.SharedMemory, l.Hypervisor, Name)
	}
}

func TestSnapshotRefusals(t *testing.T) {
	d := newTestDriver(t)
	root := t.TempDir()
	s := newStager(t, root, bakeBare(t, d, root))
	hv, err := d.Restore(testContext(t, 30*time.Second), hypervisor.RestoreRequest{StagedDir: s.stage(), RunDir: s.runDir(), Mode: hypervisor.ModeMmap})
	if err != nil {
		t.Fatal(err)
	}
	v := hv.(*VM)
	closeVM(t, v)
	// A restored VM runs in its own session: a crashing shim takes it nowhere.
	if sid, err := unix.Getsid(v.PID()); err != nil || sid != v.PID() {
		t.Errorf("restored qemu session %d (%v), want its own (%d)", sid, err, v.PID())
	}
	ctx := testContext(t, 30*time.Second)
	if err := v.Snapshot(ctx, filepath.Join(root, "odd"), "partial"); err == nil || !strings.Contains(err.Error(), `"partial"`) {
		t.Errorf("snapshot of kind partial: %v, want a refusal naming the kind", err)
	}
	booted, err := d.Boot(ctx, BootSpec{MemoryBytes: testMemory, VCPUs: 1, RunDir: filepath.Join(root, "boot")})
	if err != nil {
		t.Fatal(err)
	}
	closeVM(t, booted)
	dir := filepath.Join(root, "diff")
	err = booted.Snapshot(ctx, dir, hypervisor.SnapshotDiff)
	if !errors.Is(err, hypervisor.ErrNoDiffBase) || !strings.Contains(err.Error(), "booted") {
		t.Errorf("diff of a booted VM: %v, want ErrNoDiffBase naming the boot", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused diff left %s (%v)", dir, err)
	}
}

func TestCapabilities(t *testing.T) {
	d := newTestDriver(t)
	caps, err := d.Capabilities(testContext(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if !caps.Supports(hypervisor.ModeMmap) || !caps.Supports(hypervisor.ModeCopy) || caps.Supports(hypervisor.ModeOnDemand) {
		t.Errorf("restore modes %v, want mmap and copy only", caps.RestoreModes)
	}
	if want := []hypervisor.SnapshotKind{hypervisor.SnapshotFull, hypervisor.SnapshotDiff}; !slices.Equal(caps.SnapshotKinds, want) {
		t.Errorf("snapshot kinds %v, want %v", caps.SnapshotKinds, want)
	}
	if caps.Build != "" {
		t.Errorf("build %q before any probe: Capabilities must not run the binary", caps.Build)
	}
	build, err := d.Build(testContext(t, 10*time.Second))
	if err != nil || !strings.HasPrefix(build, "QEMU emulator version") {
		t.Fatalf("Build() = %q, %v", build, err)
	}
	if caps, _ := d.Capabilities(t.Context()); caps.Build != build {
		t.Errorf("build %q after a probe, want %q", caps.Build, build)
	}
}

// A link names the QEMU that made it exactly as --version does, though the
// VM asks QMP rather than running the binary.
func TestSnapshotNamesBuild(t *testing.T) {
	d := newTestDriver(t)
	l, err := chain.ReadLink(bakedLink(t, d))
	if err != nil {
		t.Fatal(err)
	}
	build, err := d.Build(testContext(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if l.HypervisorBuild != build {
		t.Errorf("link hypervisorBuild %q, want %q", l.HypervisorBuild, build)
	}
}
