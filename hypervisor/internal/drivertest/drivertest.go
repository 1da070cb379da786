// Package drivertest holds what the Cloud Hypervisor and Firecracker driver
// tests share: both drive apifake's fake VMMs, restore the same kind of
// staged chain and must fail the same way when a VMM hangs or dies.
package drivertest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// MemBytes is the guest memory size of a StageChain chain.
const MemBytes = 16 * 4096

// StageChain writes a one-link chain of hypervisor h with the given state
// files and stages it as the snapshotter would: memory, private copies of
// the state files and chain.json. It returns the staged directory.
func StageChain(t testing.TB, h string, state map[string][]byte) string {
	t.Helper()
	linkDir, staged := t.TempDir(), t.TempDir()
	mem := make([]byte, MemBytes)
	for i := range mem {
		if (i/4096)%3 == 0 {
			mem[i] = byte(i)
		}
	}
	for name, data := range state {
		for _, dir := range []string{linkDir, staged} {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	memPath := filepath.Join(staged, chain.StagedMemory)
	if err := os.WriteFile(memPath, mem, 0o444); err != nil {
		t.Fatal(err)
	}
	meta := chain.Meta{Hypervisor: h, GuestOS: "linux", VCPUs: 1, StateFiles: slices.Sorted(maps.Keys(state))}
	link, err := chain.WriteFull(context.Background(), memPath, meta, linkDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := chain.WriteStaged(staged, []*chain.Link{link}); err != nil {
		t.Fatal(err)
	}
	return staged
}

// RunDir is a fresh run directory path (not created).
func RunDir(t testing.TB) string {
	return filepath.Join(t.TempDir(), "run")
}

// CheckAgent dials the guest agent port of v; the fake guest echoes.
func CheckAgent(t *testing.T, ctx context.Context, v hypervisor.VM) {
	t.Helper()
	c, err := v.DialAgent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "hello\n"); err != nil {
		t.Fatal(err)
	}
	if got, err := bufio.NewReader(c).ReadString('\n'); err != nil || got != "hello\n" {
		t.Errorf("agent echo %q, %v", got, err)
	}
}

// BenchRestore measures a driver's own cost of a restore against a fake:
// spawn, API socket wait, memory set-up, the load request, then Close, in
// mmap and copy mode. It is the floor under a real VMM's load time.
// newDriver returns a driver over a fake that offers both modes.
func BenchRestore(b *testing.B, newDriver func(testing.TB) hypervisor.Driver, stage func(testing.TB) string) {
	for _, mode := range []hypervisor.Mode{hypervisor.ModeMmap, hypervisor.ModeCopy} {
		b.Run(string(mode), func(b *testing.B) {
			d := newDriver(b)
			ctx, staged := context.Background(), stage(b)
			phases := map[string]time.Duration{}
			onPhase := func(p string, d time.Duration) { phases[p] += d }
			for b.Loop() {
				v, err := d.Restore(ctx, hypervisor.RestoreRequest{StagedDir: staged, RunDir: RunDir(b), Mode: mode, OnPhase: onPhase})
				if err != nil {
					b.Fatal(err)
				}
				if err := v.Close(); err != nil {
					b.Fatal(err)
				}
			}
			for p, d := range phases {
				b.ReportMetric(float64(d.Microseconds())/float64(b.N), p+"-µs/op")
			}
		})
	}
}

// HoldsFile reports whether process pid has path's inode open.
func HoldsFile(t testing.TB, pid int, path string) bool {
	t.Helper()
	want, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		got, err := os.Stat(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && os.SameFile(got, want) {
			return true
		}
	}
	return false
}
