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
	ready    []time.Duration
	wall     time.Duration
	pssKiB   []int64
	memfdKiB []int64
	phases   [][]phase
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
		pss, err := pssKiB(c.pid)
		errs = append(errs, err)
		memfd, err := memfdKiB(c.pid)
		errs = append(errs, err)
		run.ready = append(run.ready, c.ready)
		run.pssKiB = append(run.pssKiB, pss)
		run.memfdKiB = append(run.memfdKiB, memfd)
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

// pssKiB is the proportional set size of pid: shared pages (the page cache
// of an mmap-restored memory file) are split among the processes mapping
// them.
func pssKiB(pid int) (int64, error) {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "smaps_rollup"))
	if err != nil {
		return 0, fmt.Errorf("read pss of pid %d: %w", pid, err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "Pss:" {
			return strconv.ParseInt(f[1], 10, 64)
		}
	}
	return 0, fmt.Errorf("read pss of pid %d: no Pss line in smaps_rollup", pid)
}

// memfdKiB is the memory allocated to the memfds pid holds: a copy
// restore's guest RAM. PSS counts only the pages the guest has touched
// since, so a copy clone's cost is this, not its PSS.
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
