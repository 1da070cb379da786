package bench

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	"github.com/containerd/typeurl/v2"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
	"github.com/cocoonstack/containerd-shim-cocoon/restore"
)

// The whole start: `ctr run --rm IMAGE ID echo hi` timed as a process, as
// a user times it, from ctr's start to its exit: the image and snapshot
// prepared, the task created and started, the process run, the task and
// VM torn down, the container and snapshot removed. containerd's events
// split it: each topic's time is when it was published, on the host's
// clock. The task's exit and delete split the end further only where both
// came (teardownPhases): a shim publishes them as it shuts down, and
// containerd's runc shim drops them at times (its forwarder races the
// process's exit), so they cannot mark every run.
const (
	topicContainerCreate = "/containers/create"
	topicTaskCreate      = "/tasks/create"
	topicTaskStart       = "/tasks/start"
	topicTaskExit        = "/tasks/exit"
	topicTaskDelete      = "/tasks/delete"
	topicContainerDelete = "/containers/delete"
)

// requiredMarks are the events every whole start has.
var requiredMarks = []string{topicContainerCreate, topicTaskCreate, topicTaskStart, topicContainerDelete}

// hasMarks says whether at has every topic of topics.
func hasMarks(at map[string]time.Time, topics ...string) bool {
	for _, t := range topics {
		if _, ok := at[t]; !ok {
			return false
		}
	}
	return true
}

// wholePhases are the steps of a whole start, between two marks: ctr's
// start (""), an event's topic, or ctr's exit ("").
var wholePhases = []struct{ name, from, to string }{
	{"to container", "", topicContainerCreate},
	{"task create", topicContainerCreate, topicTaskCreate},
	{"task start", topicTaskCreate, topicTaskStart},
	{"process, task delete, container delete", topicTaskStart, topicContainerDelete},
	{"to exit", topicContainerDelete, ""},
}

// teardownPhases split wholePhases' end where the shim published the
// task's exit and delete.
var teardownPhases = []struct{ name, from, to string }{
	{"process", topicTaskStart, topicTaskExit},
	{"task delete", topicTaskExit, topicTaskDelete},
	{"container delete", topicTaskDelete, topicContainerDelete},
}

// The whole start's arms.
const (
	WholeSnapshot = "cocoon mmap, snapshot image"
	WholeOrdinary = "cocoon, busybox on the base snapshot"
	WholeRunc     = "runc, busybox"
	WholeGVisor   = "gVisor (runsc, ptrace), busybox"
	// The pooled VM's arms, each measured in a set of its own with runc
	// and gVisor beside it (named after it: pooledPeer).
	WholePooled         = "cocoon, busybox on the base snapshot, pooled VM"
	WholePooledSnapshot = "cocoon mmap, snapshot image, pooled VM"
	// claimedRuns names a pooled arm's row of its claimed runs.
	claimedRuns = ", claimed runs"
)

// pooledPeer names peer, runc or gVisor, measured beside the pooled arm.
func pooledPeer(peer, pooled string) string {
	kind := "busybox"
	if pooled == WholePooledSnapshot {
		kind = "snapshot image"
	}
	return peer + " (beside a pooled " + kind + ")"
}

// wholeArm is one way to run the whole start: ctr run's flags and image.
type wholeArm struct {
	name  string
	flags []string
	image string
	// pooled: the runtime config has shim.pooled_vm, so each run's
	// create may claim the VM the spare restored after the run before.
	pooled bool
}

// WholeRow is one arm's whole start: medians of the total and of each
// phase, in wholePhases' order.
type WholeRow struct {
	Arm     string    `json:"arm"`
	Runs    int       `json:"runs"`
	TotalMs float64   `json:"totalMs"`
	PhaseMs []float64 `json:"phaseMs"`
	// TeardownRuns are the runs whose exit and delete came;
	// TeardownMs their medians of teardownPhases, none without any.
	TeardownRuns int       `json:"teardownRuns,omitempty"`
	TeardownMs   []float64 `json:"teardownMs,omitempty"`
	// Claimed are the runs of a pooled arm whose create claimed a VM
	// restored ahead (the others restored one, as without a pool).
	Claimed int `json:"claimed,omitempty"`
}

// wholeArms are the arms, each on the image and snapshotter a user would
// use: gVisor through containerd's runc shim with Debian's runsc on the
// ptrace platform (no KVM for it here) and no network (as an empty
// namespace is under runc: its netstack takes none from the namespace
// containerd gives), its flags in a wrapper.
func wholeArms(s *shimStack, tmp string) ([]wholeArm, error) {
	runsc, err := exec.LookPath("runsc")
	if err != nil {
		return nil, fmt.Errorf("gVisor arm: %w (install Debian's runsc: scripts/install-deps.sh)", err)
	}
	wrapper := filepath.Join(tmp, "runsc-ptrace")
	script := "#!/bin/sh\nexec " + runsc + " --platform=ptrace --network=none \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		return nil, fmt.Errorf("gVisor arm: %w", err)
	}
	cocoon := cocoonFlags()
	return []wholeArm{
		{name: WholeSnapshot, flags: cocoon, image: s.snapshot.Name()},
		{name: WholeOrdinary, flags: cocoon, image: s.busybox.Name()},
		{name: WholeRunc, flags: []string{"--snapshotter", runcSnapshotter}, image: s.busybox.Name()},
		{name: WholeGVisor, flags: []string{"--snapshotter", runcSnapshotter, "--runc-binary", wrapper}, image: s.busybox.Name()},
	}, nil
}

// wholeSpares is the pooled sets' shim.spares: with two, a run that
// follows another at once finds the VM restored during the run before
// that one, not only the one its predecessor's server just ordered.
const wholeSpares = 2

// pooledSets are the whole start in a pooled VM (shim.pooled_vm, in a
// runtime config of its own), an ordinary image's and a snapshot
// image's, each with runc and gVisor beside it, a set of their own: a
// spare's pooled VM is ordered by the launch before it, so another cocoon
// arm between two pooled runs would take it (and close it, its config
// or chain being another).
func pooledSets(s *shimStack, tmp string, peers []wholeArm) ([][]wholeArm, error) {
	path := filepath.Join(tmp, "cocoon-pooled.toml")
	err := s.stack.WriteConfig(path, func(c *config.Config) { c.Shim.PooledVM, c.Shim.Spares = true, wholeSpares })
	if err != nil {
		return nil, fmt.Errorf("pooled VM arm: %w", err)
	}
	flags := append(cocoonFlags(), "--runtime-config-path", path)
	var sets [][]wholeArm
	for _, a := range []wholeArm{
		{name: WholePooled, flags: flags, image: s.busybox.Name(), pooled: true},
		{name: WholePooledSnapshot, flags: flags, image: s.snapshot.Name(), pooled: true},
	} {
		set := []wholeArm{a}
		for _, p := range peers {
			if p.name == WholeRunc || p.name == WholeGVisor {
				p.name = pooledPeer(p.name, a.name)
				set = append(set, p)
			}
		}
		sets = append(sets, set)
	}
	return sets, nil
}

// cocoonFlags run a container with cocoon, in mmap mode.
func cocoonFlags() []string {
	return []string{"--runtime", devstack.Runtime, "--snapshotter", devstack.Snapshotter,
		"--annotation", restore.AnnotationMode + "=" + string(hypervisor.ModeMmap)}
}

// measureWhole runs each arm rounds times, the arms taking turns (in
// reverse every other round), and returns each arm's medians; then each
// pooled VM's set the same way, after a first pooled run that orders the
// first pooled VM.
func measureWhole(ctx context.Context, out io.Writer, s *shimStack, tmp string, rounds int) ([]WholeRow, error) {
	arms, err := wholeArms(s, tmp)
	if err != nil {
		return nil, err
	}
	sets, err := pooledSets(s, tmp, arms)
	if err != nil {
		return nil, err
	}
	marks := watchEvents(ctx, s)
	defer marks.stop()
	rows, err := measureArms(ctx, out, s, arms, rounds, "whole", marks)
	if err != nil {
		return nil, err
	}
	for i, set := range sets {
		prefix := fmt.Sprintf("whole-pool%d", i)
		if _, _, err := runWhole(ctx, s, set[0], prefix+"-first", marks); err != nil {
			return nil, fmt.Errorf("%s: %w", set[0].name, err)
		}
		more, err := measureArms(ctx, out, s, set, rounds, prefix, marks)
		if err != nil {
			return nil, err
		}
		rows = append(rows, more...)
	}
	return rows, nil
}

// measureArms runs each of arms rounds times, taking turns (in reverse
// every other round), its containers named after prefix.
func measureArms(ctx context.Context, out io.Writer, s *shimStack, arms []wholeArm, rounds int, prefix string, marks *eventMarks) ([]WholeRow, error) {
	samples, teardowns := map[string][][]time.Duration{}, map[string][][]time.Duration{}
	claimed := map[string]int{}
	for round := range rounds {
		order := slices.Clone(arms)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for i, a := range order {
			id := fmt.Sprintf("%s-%d-%d", prefix, round, i)
			d, td, err := runWhole(ctx, s, a, id, marks)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", a.name, err)
			}
			fmt.Fprintf(out, "round %d  whole %-36s %8.1f ms\n", round+1, a.name, ms(d[0]))
			samples[a.name] = append(samples[a.name], d)
			if td != nil {
				teardowns[a.name] = append(teardowns[a.name], td)
			}
			if a.pooled && claimedIn(s.stack.Logs(), id) {
				claimed[a.name]++
				samples[a.name+claimedRuns] = append(samples[a.name+claimedRuns], d)
			}
		}
	}
	rows := make([]WholeRow, 0, len(arms))
	for _, a := range arms {
		row := WholeRow{Arm: a.name, Runs: len(samples[a.name]), TeardownRuns: len(teardowns[a.name]), Claimed: claimed[a.name]}
		medians := columnMedians(samples[a.name])
		row.TotalMs, row.PhaseMs = medians[0], medians[1:]
		if row.TeardownRuns > 0 {
			row.TeardownMs = columnMedians(teardowns[a.name])
		}
		rows = append(rows, row)
		if c := samples[a.name+claimedRuns]; a.pooled && len(c) > 0 {
			medians := columnMedians(c)
			rows = append(rows, WholeRow{Arm: a.name + claimedRuns, Runs: len(c), TotalMs: medians[0], PhaseMs: medians[1:]})
		}
	}
	return rows, nil
}

// runWhole runs one whole start and returns its total, then its phases,
// and its teardownPhases when the task's exit and delete came (else nil).
func runWhole(ctx context.Context, s *shimStack, a wholeArm, id string, marks *eventMarks) ([]time.Duration, []time.Duration, error) {
	args := slices.Concat([]string{"--address", s.stack.Address, "--namespace", s.stack.Namespace, "run", "--rm"},
		a.flags, []string{a.image, id, "echo", "hi"})
	cmd := exec.CommandContext(ctx, filepath.Join(s.stack.BinDir, "ctr"), args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	began := time.Now()
	output, err := cmd.Output()
	ended := time.Now()
	if err != nil || strings.TrimSpace(string(output)) != "hi" {
		return nil, nil, fmt.Errorf("ctr run %s: %v, output %q, want \"hi\" (stderr %q)", id, err, output, stderr.String())
	}
	at, err := marks.wait(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	at[""] = began
	d := []time.Duration{ended.Sub(began)}
	for _, p := range wholePhases {
		from, to := at[p.from], at[p.to]
		if p.to == "" {
			to = ended
		}
		d = append(d, to.Sub(from))
	}
	var td []time.Duration
	if hasMarks(at, topicTaskExit, topicTaskDelete) {
		for _, p := range teardownPhases {
			td = append(td, at[p.to].Sub(at[p.from]))
		}
	}
	return d, td, nil
}

// claimedIn says whether the shim logged, in logs, that container id's
// task runs in a pooled VM.
func claimedIn(logs, id string) bool {
	return strings.Contains(logs, `msg="task runs in the pooled VM" id=`+id+" ")
}

// columnMedians are the medians, in ms, of each column of samples.
func columnMedians(samples [][]time.Duration) []float64 {
	var out []float64
	for i := range samples[0] {
		col := make([]time.Duration, 0, len(samples))
		for _, s := range samples {
			col = append(col, s[i])
		}
		out = append(out, ms(percentile(col, 0.5)))
	}
	return out
}

// eventMarks are the times of the whole start's events, by container.
type eventMarks struct {
	cancel context.CancelFunc
	mu     sync.Mutex
	at     map[string]map[string]time.Time
	err    error
}

// watchEvents records the whole start's events of s's namespace.
func watchEvents(ctx context.Context, s *shimStack) *eventMarks {
	ctx, cancel := context.WithCancel(ctx)
	m := &eventMarks{cancel: cancel, at: map[string]map[string]time.Time{}}
	ch, errs := s.cl.EventService().Subscribe(ctx, `namespace=="`+s.stack.Namespace+`"`)
	go func() {
		for {
			select {
			case e := <-ch:
				m.record(e.Topic, e.Timestamp, e.Event)
			case err := <-errs:
				m.mu.Lock()
				if ctx.Err() == nil {
					m.err = fmt.Errorf("containerd's events: %w", err)
				}
				m.mu.Unlock()
				return
			}
		}
	}()
	return m
}

func (m *eventMarks) record(topic string, at time.Time, event typeurl.Any) {
	v, err := typeurl.UnmarshalAny(event)
	if err != nil {
		return
	}
	var id string
	switch e := v.(type) {
	case *apievents.ContainerCreate:
		id = e.ID
	case *apievents.TaskCreate:
		id = e.ContainerID
	case *apievents.TaskStart:
		id = e.ContainerID
	case *apievents.TaskExit:
		if e.ID != e.ContainerID {
			return // an exec's
		}
		id = e.ContainerID
	case *apievents.TaskDelete:
		id = e.ContainerID
	case *apievents.ContainerDelete:
		id = e.ID
	default:
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.at[id] == nil {
		m.at[id] = map[string]time.Time{}
	}
	m.at[id][topic] = at
}

// wait returns container id's marks once all have come: containerd
// forwards events after the calls that cause them return.
func (m *eventMarks) wait(ctx context.Context, id string) (map[string]time.Time, error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		m.mu.Lock()
		at, err := maps.Clone(m.at[id]), m.err
		m.mu.Unlock()
		complete := hasMarks(at, requiredMarks...)
		if err != nil {
			return nil, err
		}
		if complete {
			return at, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("events of %s: have %v, want every one of the whole start's", id, at)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (m *eventMarks) stop() { m.cancel() }

// wholeTable puts the whole start's arms side by side, with the ratios
// that say how cocoon's two image kinds compare with runc and gVisor.
func (r *results) wholeTable(b *strings.Builder) {
	if len(r.Whole) == 0 {
		return
	}
	b.WriteString("\nThe whole start: `ctr run --rm IMAGE ID echo hi` timed as a process, from ctr's start to its exit, the arms taking turns; " +
		"medians of each part, split by containerd's events (container created, task created, task started, container deleted).\n\n| arm | runs | total ms |")
	for _, p := range wholePhases {
		fmt.Fprintf(b, " %s |", p.name)
	}
	b.WriteString("\n|---|---|---|" + strings.Repeat("---|", len(wholePhases)) + "\n")
	byArm := map[string]float64{}
	for _, w := range r.Whole {
		runs := strconv.Itoa(w.Runs)
		if w.Arm == WholePooled || w.Arm == WholePooledSnapshot {
			runs += fmt.Sprintf(" (%d claimed)", w.Claimed)
		}
		fmt.Fprintf(b, "| %s | %s | %.0f |", w.Arm, runs, w.TotalMs)
		for _, p := range w.PhaseMs {
			fmt.Fprintf(b, " %.0f |", p)
		}
		b.WriteString("\n")
		byArm[w.Arm] = w.TotalMs
	}
	b.WriteString("\n")
	pairs := [][2]string{{WholeOrdinary, WholeGVisor}, {WholeOrdinary, WholeRunc}, {WholeSnapshot, WholeRunc}, {WholeSnapshot, WholeGVisor}}
	for _, p := range []string{WholePooled, WholePooledSnapshot} {
		for _, a := range []string{p, p + claimedRuns} {
			pairs = append(pairs, [2]string{a, pooledPeer(WholeGVisor, p)}, [2]string{a, pooledPeer(WholeRunc, p)})
		}
	}
	for _, q := range pairs {
		if byArm[q[0]] > 0 && byArm[q[1]] > 0 {
			fmt.Fprintf(b, "%s ÷ %s: %s. ", q[0], q[1], times(ratio(byArm[q[0]], byArm[q[1]])))
		}
	}
	b.WriteString("\n")
	r.teardownTable(b)
}

// teardownTable splits the whole start's end, for the arms whose shim
// published the task's exit and delete, in the runs where it did.
func (r *results) teardownTable(b *strings.Builder) {
	var rows []WholeRow
	for _, w := range r.Whole {
		if w.TeardownRuns > 0 {
			rows = append(rows, w)
		}
	}
	if len(rows) == 0 {
		return
	}
	b.WriteString("\nThe end of it split by the task's exit and delete events, in the runs that had both (medians in ms):\n\n| arm | runs |")
	for _, p := range teardownPhases {
		fmt.Fprintf(b, " %s |", p.name)
	}
	b.WriteString("\n|---|---|" + strings.Repeat("---|", len(teardownPhases)) + "\n")
	for _, w := range rows {
		fmt.Fprintf(b, "| %s | %d of %d |", w.Arm, w.TeardownRuns, w.Runs)
		for _, p := range w.TeardownMs {
			fmt.Fprintf(b, " %.0f |", p)
		}
		b.WriteString("\n")
	}
}
