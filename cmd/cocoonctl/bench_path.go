package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// benchArgs is the process each clone starts in its guest: it stays up so
// every clone of a cell runs at once while PSS is read.
var benchArgs = []string{"/bin/sleep", "3600"}

// restorePath is one way to get a clone from a snapshot to a process
// running in its guest.
type restorePath interface {
	name() string
	// firstPrepare stages the chain once on a node that has never
	// flattened it and returns how long that took (mostly the flatten).
	firstPrepare(ctx context.Context) (time.Duration, error)
	// start stages, restores and starts benchArgs in clone id; it returns
	// once the guest reports the process started.
	start(ctx context.Context, id string, mode hypervisor.Mode) (*clone, error)
	close() error
}

// clone is one restored VM running benchArgs.
type clone struct {
	pid    int           // the hypervisor process
	ready  time.Duration // create to process started
	phases []phase       // the restore report's phases
	stop   func(ctx context.Context) error
}

// phase is one step of a restore report.
type phase struct {
	Name     string
	Duration time.Duration
}

// cellRun is one run of n concurrent clones on one path in one mode.
type cellRun struct {
	ready   []time.Duration
	wall    time.Duration
	pssKiB  []int64
	heldKiB []int64
	phases  [][]phase
}

// runCell starts n clones at once, measures them while all run, and stops
// them. A failed clone fails the run, after the others are stopped.
func runCell(ctx context.Context, p restorePath, n, round int, mode hypervisor.Mode) (cellRun, error) {
	clones := make([]*clone, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("b%d-%s-%s-%d", round, p.name()[:1], mode, i)
			clones[i], errs[i] = p.start(ctx, id, mode)
		}()
	}
	wg.Wait()
	run := cellRun{wall: time.Since(start)}
	for _, c := range clones {
		if c == nil {
			continue
		}
		pss, held, err := cloneMemory(c.pid)
		errs = append(errs, err)
		run.ready = append(run.ready, c.ready)
		run.pssKiB = append(run.pssKiB, pss)
		run.heldKiB = append(run.heldKiB, held)
		run.phases = append(run.phases, c.phases)
	}
	errs = append(errs, stopAll(clones))
	if err := errors.Join(errs...); err != nil {
		return cellRun{}, fmt.Errorf("%s %s n=%d: %w", p.name(), mode, n, err)
	}
	return run, nil
}

// stopAll stops the clones concurrently.
func stopAll(clones []*clone) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := make([]error, len(clones))
	var wg sync.WaitGroup
	for i, c := range clones {
		if c == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.stop(ctx)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// cloneMemory reads what clone pid costs in memory. pss is its
// proportional set size: shared pages (the page cache of an mmap-restored
// memory file) are split among the processes mapping them. PSS counts only
// the pages a process has touched, so a copy restore's guest RAM in a
// memfd is mostly missing from it; held adds the memfd's allocated size in
// place of its touched share.
func cloneMemory(pid int) (pss, held int64, err error) {
	rollup, err := smapsRollup(pid)
	if err != nil {
		return 0, 0, err
	}
	memfd, err := memfdKiB(pid)
	if err != nil {
		return 0, 0, err
	}
	return rollup["Pss"], rollup["Pss"] - rollup["Pss_Shmem"] + memfd, nil
}

// smapsRollup returns the kB fields of /proc/pid/smaps_rollup.
func smapsRollup(pid int) (map[string]int64, error) {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "smaps_rollup"))
	if err != nil {
		return nil, fmt.Errorf("read memory of pid %d: %w", pid, err)
	}
	fields := map[string]int64{}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[2] == "kB" {
			n, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("read memory of pid %d: %s: %w", pid, line, err)
			}
			fields[strings.TrimSuffix(f[0], ":")] = n
		}
	}
	if _, ok := fields["Pss"]; !ok {
		return nil, fmt.Errorf("read memory of pid %d: no Pss in smaps_rollup", pid)
	}
	return fields, nil
}

// memfdKiB is the memory allocated to the memfds pid holds: a copy
// restore's guest RAM.
func memfdKiB(pid int) (int64, error) {
	fdDir := filepath.Join("/proc", strconv.Itoa(pid), "fd")
	des, err := os.ReadDir(fdDir)
	if err != nil {
		return 0, fmt.Errorf("list fds of pid %d: %w", pid, err)
	}
	var total int64
	seen := map[uint64]bool{} // QEMU reopens the memfd we pass it
	for _, de := range des {
		p := filepath.Join(fdDir, de.Name())
		if target, err := os.Readlink(p); err != nil || !strings.HasPrefix(target, "/memfd:") {
			continue
		}
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err == nil && !seen[st.Ino] {
			seen[st.Ino] = true
			total += st.Blocks * 512 / 1024
		}
	}
	return total, nil
}
