package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"
)

// benchArgs is the process every clone starts: it stays up so every clone
// of a cell runs at once while its memory is read.
var benchArgs = []string{"/bin/sleep", "3600"}

// The ways to start a container the bench compares (armID.Path).
const (
	PathDirect = "direct" // restore.Run on the QEMU driver, no containerd
	PathShim   = "shim"   // containerd + cocoon-snapshotter + the cocoon shim
	PathRunc   = "runc"   // containerd + overlayfs + containerd-shim-runc-v2
	PathCold   = "cold"   // the QEMU driver's Boot of the same guest, no snapshot
)

// Variants of the shim path (armID.Variant).
const (
	VariantNetwork  = "network"  // the task's spec names a network namespace with a veth
	VariantOrdinary = "ordinary" // an ordinary OCI image on the runtime class's base snapshot
)

// armID names one arm: a path, the restore mode for the paths that
// restore, and a variant of the shim path.
type armID struct {
	Path    string `json:"path"`
	Mode    string `json:"mode,omitempty"`
	Variant string `json:"variant,omitempty"`
}

// String is the arm's label in tables and charts: "shim mmap network".
func (a armID) String() string {
	return strings.Join(strings.Fields(a.Path+" "+a.Mode+" "+a.Variant), " ")
}

// arm starts containers one way.
type arm interface {
	// start starts clone id and returns once its process runs.
	start(ctx context.Context, id string) (*clone, error)
}

// cellPreparer is an arm that sets up something per clone before a cell's
// clones start (not timed), and takes it down after they stopped.
type cellPreparer interface {
	prepare(ctx context.Context, ids []string) (cleanup func() error, err error)
}

// armAt is an arm and the counts it runs at (nil: every count).
type armAt struct {
	id  armID
	arm arm
	ns  []int
	// own: the arm runs in a set of its own (measurePooled), not among
	// the others.
	own bool
}

func (a armAt) runsAt(n int) bool { return a.ns == nil || slices.Contains(a.ns, n) }

// clone is one running container.
type clone struct {
	pid      int   // the hypervisor process, or runc's container process
	guestKiB int64 // the guest RAM mapping's size; 0 without a guest
	ready    time.Duration
	phases   []phase
	stop     func(ctx context.Context) error
}

// Phases the bench times itself; the rest come from restore reports.
const (
	phaseStage     = "stage"           // the snapshotter's Prepare (direct path)
	phaseContainer = "container"       // the client's NewContainer, which stages the snapshot
	phaseBoot      = "boot"            // a cold boot's QEMU start, up to running the guest
	phaseStarted   = "process started" // the agent's exec of benchArgs
)

// phase is one step of starting a clone.
type phase struct {
	Name     string
	Duration time.Duration
}

// cellRun is one run of n concurrent clones of one arm.
type cellRun struct {
	ready  []time.Duration
	wall   time.Duration
	mem    []cloneMemory
	phases [][]phase
	failed []error // clones that did not start, not in the samples
}

// runCell starts n clones of a at once, measures them while all run, and
// stops them. A clone that fails to start is recorded in the run and left
// out of its samples, so one stuck guest in a long run is reported instead
// of losing the run; a run in which every clone failed, or whose clones
// cannot be measured or stopped, fails.
func runCell(ctx context.Context, a armAt, n, round int) (run cellRun, err error) {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("b%d-%s-%d", round, strings.ReplaceAll(a.id.String(), " ", "-"), i)
	}
	if p, ok := a.arm.(cellPreparer); ok {
		cleanup, err := p.prepare(ctx, ids)
		if err != nil {
			return cellRun{}, fmt.Errorf("%s n=%d: %w", a.id, n, err)
		}
		defer func() { err = errors.Join(err, cleanup()) }()
	}
	clones := make([]*clone, n)
	startErrs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			clones[i], startErrs[i] = a.arm.start(ctx, ids[i])
		}()
	}
	wg.Wait()
	run = cellRun{wall: time.Since(start)}
	var errs []error
	for i, c := range clones {
		if c == nil {
			run.failed = append(run.failed, startErrs[i])
			continue
		}
		mem, err := readCloneMemory(c.pid, c.guestKiB)
		errs = append(errs, err)
		run.ready = append(run.ready, c.ready)
		run.mem = append(run.mem, mem)
		run.phases = append(run.phases, c.phases)
	}
	errs = append(errs, stopAll(clones), ctx.Err())
	if len(run.ready) == 0 {
		errs = append(errs, errors.Join(run.failed...))
	}
	if err := errors.Join(errs...); err != nil {
		return cellRun{}, fmt.Errorf("%s n=%d: %w", a.id, n, err)
	}
	return run, nil
}

// prepareOnce prepares snapshot key of parent on sn, removes it again and
// returns how long the Prepare took: on a node that never staged parent,
// that is mostly flattening its chain or building its filesystem image.
func prepareOnce(ctx context.Context, sn snapshots.Snapshotter, key, parent string) (time.Duration, error) {
	start := time.Now()
	if _, err := sn.Prepare(ctx, key, parent); err != nil {
		return 0, fmt.Errorf("prepare a snapshot of %s: %w", parent, err)
	}
	d := time.Since(start)
	if err := sn.Remove(ctx, key); err != nil {
		return 0, fmt.Errorf("remove snapshot %s: %w", key, err)
	}
	return d, nil
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
