package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/cpuload"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/stackrun"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/spare"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/vm"
)

// Variants of the burst in pooled VMs (shim.pooled_vm, with as many
// spares as the largest burst: pooledSpares), a set of arms of their own:
// any other cocoon arm between two of its bursts would take the spares'
// VMs.
const (
	// VariantPooled: N containers at once, each claiming a spare's VM,
	// once every spare's VM is restored and warm and the machine quiet.
	VariantPooled = "pooled"
	// VariantRefilling: the same right after a pooled burst, while its
	// tasks' servers refill the spares (restoring and warming their VMs).
	VariantRefilling = "pooled right after"
	// VariantBesidePooled: runc at the same N, in the same round.
	VariantBesidePooled = "beside pooled"
)

// Before a burst, pooledFillWait bounds the wait for the spares' VMs,
// and pooledQuietWait the wait that follows, for a quiet machine.
const (
	pooledFillWait  = 3 * time.Minute
	pooledQuietWait = 30 * time.Second
)

// quietBusy is the share of the machine's CPU time below which it counts
// as quiet: the spares' fills done (waiting VMs take ~1% each).
const quietBusy = 0.3

// pooledSpares is how many spares the pooled set's config keeps: one
// for each clone of its largest burst.
func pooledSpares(ns []int) int { return slices.Max(ns) }

// addPooledArms adds the pooled set's arms at counts o.PooledNs, in a
// containerd of their own with a runtime config of their own in tmp.
func (set *armSet) addPooledArms(ctx context.Context, o Options, img stackrun.SnapshotImage, guestKiB int64, tmp string) error {
	s, err := openStack(ctx, o, img, guestKiB, []string{runcSnapshotter})
	if err != nil {
		return fmt.Errorf("pooled VM arms: %w", err)
	}
	set.pooled = s
	path := filepath.Join(tmp, "cocoon-pooled-burst.toml")
	err = s.stack.WriteConfig(path, func(c *config.Config) {
		c.Shim.PooledVM, c.Shim.Spares = true, pooledSpares(o.PooledNs)
	})
	if err != nil {
		return fmt.Errorf("pooled VM arms: %w", err)
	}
	pooled := shimArm{s: s, mode: hypervisor.ModeMmap, runtime: &runtimeoptions.Options{ConfigPath: path}}
	set.addOwn(armID{Path: PathShim, Mode: mmap, Variant: VariantPooled}, pooled, o.PooledNs)
	set.addOwn(armID{Path: PathShim, Mode: mmap, Variant: VariantRefilling}, pooled, o.PooledNs)
	set.addOwn(armID{Path: PathRunc, Variant: VariantBesidePooled}, runcArm{s: s}, o.PooledNs)
	return nil
}

// addOwn adds an arm measurePooled runs, not runCells.
func (set *armSet) addOwn(id armID, a arm, ns []int) {
	set.arms = append(set.arms, armAt{id: id, arm: a, ns: ns, own: true})
}

// poolCost is what the spares and their pooled VMs cost while they wait,
// measured before a burst: per VM and per spare, medians over rounds.
type poolCost struct {
	N   int `json:"n"`
	VMs int `json:"vms"`
	// PSS of a waiting VM's hypervisor (its guest's touched memory and,
	// under TCG, its translated code) and of a spare task server.
	VMPSSMiB    float64 `json:"vmPssMiB"`
	SparePSSMiB float64 `json:"sparePssMiB"`
	// VMCPU is a waiting VM's CPU time, percent of one CPU.
	VMCPU float64 `json:"vmCpuPercent"`
}

// measurePooled runs the pooled set at each count of ns per round: the
// burst once the spares' VMs wait warm, the burst right after it, and
// runc. A first pooled start, not counted, has its server fill the spares.
func measurePooled(ctx context.Context, out io.Writer, s *shimStack, arms []armAt, ns []int, rounds int) (map[cellKey][]cellRun, []poolCost, error) {
	var own []armAt
	for _, a := range arms {
		if a.own {
			own = append(own, a)
		}
	}
	if len(own) == 0 {
		return nil, nil, nil
	}
	if _, err := runCell(ctx, own[0], 1, -1); err != nil {
		return nil, nil, fmt.Errorf("order the pooled VMs: %w", err)
	}
	runs := map[cellKey][]cellRun{}
	costs := map[int][]poolCost{}
	for round := range rounds {
		for _, n := range ns {
			waited, err := awaitPool(ctx, s, n)
			if err != nil {
				return nil, nil, err
			}
			cost := measurePoolCost(s, n)
			costs[n] = append(costs[n], cost)
			fmt.Fprintf(out, "round %d  n=%-2d %d pooled VMs waiting after %.1f s: PSS %.1f MiB per VM, %.1f per spare; %.2f%% of a CPU per VM\n",
				round+1, n, cost.VMs, waited.Seconds(), cost.VMPSSMiB, cost.SparePSSMiB, cost.VMCPU)
			for _, a := range own {
				run, err := runCell(ctx, a, n, round)
				if err != nil {
					return nil, nil, err
				}
				k := cellKey{arm: a.id, n: n}
				runs[k] = append(runs[k], run)
				fmt.Fprintf(out, "round %d  n=%-2d %-26s p50 %8.1f ms  wall %8.1f ms  claimed %d of %d\n",
					round+1, n, a.id, ms(percentile(run.ready, 0.5)), ms(run.wall), claimed(run), len(run.ready))
			}
		}
	}
	return runs, medianCosts(ns, costs), nil
}

// poolCostWindow is how long a waiting VM's CPU time is counted.
const poolCostWindow = time.Second

// measurePoolCost reads the waiting pooled VMs' and their spares' memory
// and the VMs' CPU time over poolCostWindow.
func measurePoolCost(s *shimStack, n int) poolCost {
	dir := filepath.Join(s.stack.RunDir, s.stack.Namespace)
	vms, spares := PooledProcesses(dir)
	c := poolCost{N: n, VMs: len(vms)}
	if len(vms) == 0 {
		return c
	}
	before := cpuTicks(vms)
	time.Sleep(poolCostWindow)
	ticks := cpuTicks(vms) - before
	c.VMCPU = round1(100 * float64(ticks) / float64(clockTicks) / poolCostWindow.Seconds() / float64(len(vms)))
	c.VMPSSMiB = round1(meanPSS(vms))
	c.SparePSSMiB = round1(meanPSS(spares))
	return c
}

// clockTicks is USER_HZ, the unit of /proc/pid/stat's CPU times.
const clockTicks = 100

// PooledProcesses finds the hypervisors of the pooled VMs run in dir
// (their command lines name their run dirs, pool-<spare's pid>) and the
// spares holding them.
func PooledProcesses(dir string) (vms, spares []int) {
	des, _ := os.ReadDir("/proc")
	for _, de := range des {
		pid, err := strconv.Atoi(de.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", de.Name(), "cmdline"))
		_, rest, ok := strings.Cut(string(cmdline), filepath.Join(dir, "pool-"))
		if !ok {
			continue
		}
		digits := strings.FieldsFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
		if len(digits) == 0 {
			continue
		}
		if spare, err := strconv.Atoi(digits[0]); err == nil && pid != spare {
			vms, spares = append(vms, pid), append(spares, spare)
		}
	}
	return vms, spares
}

// cpuTicks sums the user and system time of pids, in clock ticks.
func cpuTicks(pids []int) int64 {
	var sum int64
	for _, pid := range pids {
		data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil {
			continue
		}
		s := string(data)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		for _, i := range []int{11, 12} { // utime, stime (fields 14, 15)
			if i < len(f) {
				v, _ := strconv.ParseInt(f[i], 10, 64)
				sum += v
			}
		}
	}
	return sum
}

// meanPSS is the mean PSS of pids in MiB, of those still there.
func meanPSS(pids []int) float64 {
	var sum float64
	n := 0
	for _, pid := range pids {
		if m, err := readCloneMemory(pid, 0); err == nil {
			sum += float64(m.pss) / 1024
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}

// medianCosts is each count's pool cost, medians over its rounds.
func medianCosts(ns []int, costs map[int][]poolCost) []poolCost {
	var out []poolCost
	for _, n := range ns {
		var vms, vmPSS, sparePSS, cpu []float64
		for _, c := range costs[n] {
			vms, vmPSS, sparePSS, cpu = append(vms, float64(c.VMs)), append(vmPSS, c.VMPSSMiB), append(sparePSS, c.SparePSSMiB), append(cpu, c.VMCPU)
		}
		if len(vms) > 0 {
			out = append(out, poolCost{N: n, VMs: int(medianFloat(vms)), VMPSSMiB: round1(medianFloat(vmPSS)),
				SparePSSMiB: round1(medianFloat(sparePSS)), VMCPU: round1(medianFloat(cpu))})
		}
	}
	return out
}

// claimed counts the clones of run whose create claimed a pooled VM.
func claimed(run cellRun) int {
	n := 0
	for _, ps := range run.phases {
		for _, p := range ps {
			if p.Name == vm.PhaseClaim {
				n++
				break
			}
		}
	}
	return n
}

// awaitPool waits until the stack's spares hold at least n pooled VMs
// (pooledFillWait at most; fewer then is an error) and then until the
// machine is quiet, their fills and warm-ups done (pooledQuietWait at
// most: other work may keep it busy), and says how long it took.
func awaitPool(ctx context.Context, s *shimStack, n int) (time.Duration, error) {
	start := time.Now()
	dir := filepath.Join(s.stack.RunDir, s.stack.Namespace)
	var pooled time.Time // when n were there
	for {
		if pooled.IsZero() && pooledVMs(dir) >= n {
			pooled = time.Now()
		}
		quiet := cpuload.Busy(500*time.Millisecond) < quietBusy
		switch {
		case !pooled.IsZero() && (quiet || time.Since(pooled) > pooledQuietWait):
			return time.Since(start), nil
		case pooled.IsZero() && time.Since(start) > pooledFillWait:
			return 0, fmt.Errorf("%d pooled VMs after %v, want %d (%s)", pooledVMs(dir), pooledFillWait, n, spareState(s.stack.Dir, dir))
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
	}
}

// pooledVMs counts the pooled VMs' run dirs in dir.
func pooledVMs(dir string) int {
	des, _ := os.ReadDir(dir)
	n := 0
	for _, de := range des {
		if strings.HasPrefix(de.Name(), "pool-") {
			n++
		}
	}
	return n
}

// spareState says, for an error, which spare sockets the stack in
// stackDir has (its socket dir is stackDir/s; a ".pending" one is a spare
// still starting, or one whose start was cut) and how many of its spares
// hold a VM in runDir.
func spareState(stackDir, runDir string) string {
	des, _ := os.ReadDir(filepath.Join(stackDir, "s"))
	var sockets []string
	for _, de := range des {
		if strings.HasPrefix(de.Name(), spare.SocketPrefix) {
			sockets = append(sockets, de.Name())
		}
	}
	_, holding := PooledProcesses(runDir)
	return fmt.Sprintf("spare sockets %v, %d spares holding a VM", sockets, len(holding))
}
