package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// benchArgs is the process each clone starts in its guest: it stays up so
// every clone of a cell runs at once while PSS is read.
var benchArgs = []string{"/bin/sleep", "3600"}

// restorePath is one way to get a clone from a snapshot to a process
// running in its guest.
type restorePath interface {
	name() string
	// stage stages the chain for one clone, removes it again and returns
	// how long staging took: on a node that never staged the chain, that
	// is mostly flattening it.
	stage(ctx context.Context) (time.Duration, error)
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
	ready  []time.Duration
	wall   time.Duration
	mem    []cloneMemory
	phases [][]phase
}

// runCell starts n clones at once, measures them while all run, and stops
// them. A failed clone fails the run, after the others are stopped.
func runCell(ctx context.Context, p restorePath, n, round int, mode hypervisor.Mode, guestKiB int64) (cellRun, error) {
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
		mem, err := readCloneMemory(c.pid, guestKiB)
		errs = append(errs, err)
		run.ready = append(run.ready, c.ready)
		run.mem = append(run.mem, mem)
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
