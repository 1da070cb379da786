package restore

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/qemu"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// bakeQEMU cold-boots the project's guest (256 MiB) on QEMU, waits for its
// agent and snapshots it into a full link.
func bakeQEMU(tb testing.TB) string {
	tb.Helper()
	testenv.QEMU(tb)
	guest := testenv.Guest(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	root := tb.TempDir()
	vm, err := qemu.New(config.Default().QEMU).Boot(ctx, qemu.BootSpec{
		Kernel: filepath.Join(guest, "vmlinuz"), Initrd: filepath.Join(guest, "initramfs.cpio.gz"),
		Cmdline: "console=ttyS0 panic=-1", MemoryBytes: 256 << 20, VCPUs: 1, RunDir: filepath.Join(root, "boot"),
	})
	if err != nil {
		tb.Fatalf("boot guest: %v", err)
	}
	defer vm.Close()
	c, err := agent.WaitReady(ctx, vm.DialAgent)
	if err != nil {
		console, _ := os.ReadFile(vm.SerialLog())
		tb.Fatalf("guest agent after boot: %v; console:\n%s", err, console)
	}
	c.Close()
	link := filepath.Join(root, "link")
	if err := vm.Snapshot(ctx, link, hypervisor.SnapshotFull); err != nil {
		tb.Fatalf("snapshot: %v", err)
	}
	return link
}

// flatten builds link's flat memory file once, as the snapshotter's cache.
func flatten(tb testing.TB, link string) string {
	tb.Helper()
	flat := filepath.Join(tb.TempDir(), "flat")
	if err := chain.Flatten(context.Background(), []string{link}, flat); err != nil {
		tb.Fatal(err)
	}
	return flat
}

// stage lays out link in a new staged dir as the snapshotter does: memory
// a hard link of the flat file, private copies of the state files,
// chain.json.
func stage(tb testing.TB, link, flat string) string {
	tb.Helper()
	dir := filepath.Join(tb.TempDir(), "staged")
	if err := os.Mkdir(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.Link(flat, filepath.Join(dir, chain.StagedMemory)); err != nil {
		tb.Fatal(err)
	}
	l, err := chain.ReadLink(link)
	if err != nil {
		tb.Fatal(err)
	}
	for _, name := range l.StateFiles {
		b, err := os.ReadFile(filepath.Join(link, name))
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, name), b, 0o644)
		}
		if err != nil {
			tb.Fatal(err)
		}
	}
	if err := chain.WriteStaged(dir, []*chain.Link{l}); err != nil {
		tb.Fatal(err)
	}
	return dir
}

// planFor decides the plan for link on the real QEMU driver.
func planFor(tb testing.TB, d hypervisor.Driver, link, mode string) Plan {
	tb.Helper()
	l, err := chain.ReadLink(link)
	if err != nil {
		tb.Fatal(err)
	}
	caps, err := d.Capabilities(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	p, err := Decide(Inputs{Hypervisor: d.Name(), Caps: caps, Link: l, Config: config.Restore{Mode: mode}})
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// TestRunQEMU restores a baked guest in copy and mmap through Run and
// checks the guest took the new hostname.
func TestRunQEMU(t *testing.T) {
	link := bakeQEMU(t)
	flat := flatten(t, link)
	d := qemu.New(config.Default().QEMU)
	for _, mode := range []string{"copy", "mmap"} {
		t.Run(mode, func(t *testing.T) {
			staged := stage(t, link, flat)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			res, err := Run(ctx, d, Request{StagedDir: staged, RunDir: filepath.Join(t.TempDir(), "vm"),
				Plan: planFor(t, d, link, mode), Hostname: "clone-" + mode, AgentTimeout: time.Minute})
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			defer res.VM.Close()
			defer res.Agent.Close()
			for _, p := range []string{"spawn", "load", PhaseResume, PhaseAgent, PhaseInit} {
				if !slices.ContainsFunc(res.Report.Phases, func(x Phase) bool { return x.Name == p }) {
					t.Errorf("report %s lacks phase %s", res.Report, p)
				}
			}
			_, err = os.Stat(filepath.Join(staged, chain.StagedMemory))
			if released := errors.Is(err, os.ErrNotExist); released != res.Report.Plan.ReleaseAfterLoad {
				t.Errorf("staged memory released %v, plan says %v", released, res.Report.Plan.ReleaseAfterLoad)
			}
			if got := guestOutput(t, res.Agent, "hostname"); got != "clone-"+mode+"\n" {
				t.Errorf("guest hostname = %q", got)
			}
		})
	}
	t.Run("copy retry", func(t *testing.T) { testRetryAfterFailedCopy(t, d, link, flat) })
}

// testRetryAfterFailedCopy fails a copy restore after the load (the guest
// refuses its hostname) and retries it on the same staged directory, as a
// task started again on the same container snapshot does: the staged
// memory must still be there for the retry, and gone once it succeeds.
func testRetryAfterFailedCopy(t *testing.T, d hypervisor.Driver, link, flat string) {
	staged := stage(t, link, flat)
	mem := filepath.Join(staged, chain.StagedMemory)
	r := Request{StagedDir: staged, RunDir: filepath.Join(t.TempDir(), "vm"), Plan: planFor(t, d, link, "copy"), AgentTimeout: time.Minute}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r.Hostname = strings.Repeat("h", 100) // sethostname(2) allows 64 bytes
	if res, err := Run(ctx, d, r); err == nil || !strings.Contains(err.Error(), "init guest identity") {
		if err == nil {
			res.Agent.Close()
			res.VM.Close()
		}
		t.Fatalf("Run with a bad hostname: %v, want the init to fail", err)
	}
	if _, err := os.Stat(mem); err != nil {
		t.Fatalf("a failed copy restore released the staged memory: %v", err)
	}
	r.Hostname = "clone-retry"
	res, err := Run(ctx, d, r)
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	defer res.VM.Close()
	defer res.Agent.Close()
	if _, err := os.Stat(mem); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("staged memory after the retry succeeded: %v, want it released", err)
	}
	if got := guestOutput(t, res.Agent, "hostname"); got != "clone-retry\n" {
		t.Errorf("guest hostname = %q", got)
	}
}

func guestOutput(t *testing.T, c *agent.Client, cmd string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	proc, err := c.Exec(ctx, agent.ExecRequest{ID: cmd, Args: strings.Fields(cmd), Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	_, stdout, _ := proc.Stdio()
	b, _ := io.ReadAll(stdout)
	if st, err := c.Wait(ctx, cmd); err != nil || st.Code != 0 {
		t.Fatalf("%s in guest: %+v %v", cmd, st, err)
	}
	return string(b)
}

// BenchmarkRunQEMU restores a baked 256 MiB guest to a ready, initialised
// agent, per mode, and reports each phase's mean and Run's total in ms.
func BenchmarkRunQEMU(b *testing.B) {
	link := bakeQEMU(b)
	flat := flatten(b, link)
	d := qemu.New(config.Default().QEMU)
	for _, mode := range []string{"copy", "mmap"} {
		b.Run(mode, func(b *testing.B) {
			plan := planFor(b, d, link, mode)
			sums := map[string]time.Duration{}
			n := 0
			for b.Loop() {
				b.StopTimer()
				staged := stage(b, link, flat)
				b.StartTimer()
				res, err := Run(context.Background(), d, Request{StagedDir: staged, RunDir: filepath.Join(b.TempDir(), "vm"),
					Plan: plan, Hostname: "bench", AgentTimeout: time.Minute})
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				res.Agent.Close()
				res.VM.Close()
				for _, p := range res.Report.Phases {
					sums[p.Name] += p.Duration.D()
				}
				sums["total"] += res.Report.Total
				n++
				b.StartTimer()
			}
			for name, sum := range sums {
				b.ReportMetric(float64(sum.Microseconds())/1000/float64(n), name+"-ms")
			}
		})
	}
}
