package restore

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containerd/log"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// Phases Run times itself. Drivers report theirs (spawn, load) through
// hypervisor.RestoreRequest.OnPhase; they come first in the report.
const (
	PhaseResume  = "resume"
	PhaseAgent   = "agent"
	PhaseInit    = "init"
	PhaseRelease = "release"
)

// GuestPhasePrefix begins the name of a phase the guest timed: a step of
// a call to it, whose time the call's phase does not count again.
const GuestPhasePrefix = "guest "

// entropyBytes is the randomness each restored guest gets to reseed its
// CRNG, so clones of one snapshot do not share random streams.
const entropyBytes = 32

// Request is one restore of a staged chain.
type Request struct {
	// StagedDir is the snapshotter's staged directory; RunDir is private
	// to this VM (the driver creates and removes it).
	StagedDir, RunDir string
	// Staged is StagedDir's chain as the caller read it to plan; nil has
	// the driver read it.
	Staged *chain.Staged
	Plan   Plan
	// Hostname is set in the guest after restore.
	Hostname string
	// AgentTimeout bounds waiting for the guest agent after resume, and
	// then the identity call.
	AgentTimeout time.Duration
	// NetNS, NIC and Disk go to the driver as they are (see
	// hypervisor.RestoreRequest).
	NetNS *os.File
	NIC   *hypervisor.NIC
	Disk  string
	// Guest is what the guest gets with its identity.
	Guest GuestSetup
	// Deferred leaves the guest as the snapshot had it, its agent
	// connected: the VM waits for a task that Claim gives it to. Its
	// hypervisor is tied to the caller (hypervisor.RestoreRequest.Attached):
	// no task record names it.
	Deferred bool
}

// GuestSetup is what Init gives a restored guest besides its identity: the
// files to write, its root, its network and the process to prepare.
type GuestSetup struct {
	Files  []agent.File
	Rootfs *agent.Rootfs
	// Process, when set, is prepared in the guest for the caller to start
	// with Agent.Start (if Agent.Prepared says the guest could).
	Process *agent.ExecRequest
	// Sysctls are set in the guest, its pod's and its spec's.
	Sysctls map[string]string
	// Network, when set, is asked after the driver restored the VM (the
	// task's hooks may configure the namespace only then) for the guest
	// NIC's configuration; nil leaves the NIC down.
	Network func() *agent.Network
	// BeforeInit, when set, runs with the connected agent before Init:
	// what Rootfs's mounts need in the guest first (shared directories).
	BeforeInit func(ctx context.Context, c *agent.Client) error
	// WarmContainers has a VM that will host containers warm its runc
	// once Init is done (agent.InitRequest.WarmContainers), or with
	// WarmOwnInit the agent's own container init.
	WarmContainers, WarmOwnInit bool
}

// Phase is how long one step of a restore took.
type Phase struct {
	Name     string          `json:"name"`
	Duration config.Duration `json:"duration"`
}

// Report is what a restore did and how long each step took.
type Report struct {
	Plan   Plan
	Phases []Phase
	Total  time.Duration
}

// Result is a restored, running VM with a connected, initialised agent.
type Result struct {
	VM     hypervisor.VM
	Agent  *agent.Client
	Report Report
}

// Run restores r.StagedDir with d (paused), resumes the VM, connects to its
// agent and gives the guest a fresh identity (wall clock, entropy,
// hostname) and what r.Guest holds, in one call. Then, if the plan says so, it releases the staged memory. On
// error nothing is left running (the VM is closed) and the staged
// directory is as it was, so the restore can be retried. On success the
// caller owns the VM and the agent client and closes both.
func Run(ctx context.Context, d hypervisor.Driver, r Request) (*Result, error) {
	if r.AgentTimeout <= 0 {
		return nil, fmt.Errorf("restore: agent timeout %s: want a positive duration", r.AgentTimeout)
	}
	start := time.Now()
	rec := &recorder{}
	vm, err := d.Restore(ctx, hypervisor.RestoreRequest{
		StagedDir: r.StagedDir,
		Staged:    r.Staged,
		RunDir:    r.RunDir,
		Mode:      r.Plan.Mode,
		OnPhase:   rec.add,
		NetNS:     r.NetNS,
		NIC:       r.NIC,
		Disk:      r.Disk,
		Attached:  r.Deferred,
	})
	if err != nil {
		return nil, fmt.Errorf("restore %s vm in %s mode: %w", d.Name(), r.Plan.Mode, err)
	}
	c, err := bringUp(ctx, vm, r, rec)
	if err != nil {
		if cerr := vm.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("close vm: %w", cerr))
		}
		return nil, err
	}
	release(ctx, r, rec)
	rep := Report{Plan: r.Plan, Phases: rec.list(), Total: time.Since(start)}
	log.G(ctx).WithFields(log.Fields{
		"hypervisor": d.Name(), "mode": r.Plan.Mode, "pid": vm.PID(), "timings": rep.String(),
	}).Info("vm restored")
	return &Result{VM: vm, Agent: c, Report: rep}, nil
}

// bringUp resumes the paused VM, connects to its agent and initialises the
// guest. The caller closes the VM if it fails. The guest's agent serves
// (it did when the snapshot was taken), so Init follows the connection
// request at once (agent.Eager): the agent phase ends when the agent
// accepts the connection, the init phase when Init is answered.
func bringUp(ctx context.Context, vm hypervisor.VM, r Request, rec *recorder) (*agent.Client, error) {
	if err := rec.time(PhaseResume, func() error { return vm.Resume(ctx) }); err != nil {
		return nil, fmt.Errorf("resume vm: %w", err)
	}
	var c *agent.Client
	inited := make(chan initResult, 1)
	err := rec.time(PhaseAgent, func() error {
		actx, cancel := context.WithTimeout(ctx, r.AgentTimeout)
		defer cancel()
		actx, stop := whileRunning(actx, vm)
		defer stop()
		var err error
		if c, err = agent.Connect(agent.Eager(actx), vm.DialAgent); err != nil {
			return vmExited(actx, err)
		}
		go func() {
			if r.Deferred {
				inited <- initResult{}
				return
			}
			phases, err := initGuest(ctx, c, r)
			inited <- initResult{phases, err}
		}()
		return vmExited(actx, c.Accepted(actx))
	})
	if errors.Is(err, ErrVMExited) {
		return nil, fmt.Errorf("guest agent: %w", err)
	}
	if err != nil {
		if c != nil {
			c.Close()
			<-inited
		}
		return nil, fmt.Errorf("guest agent not ready within %s: %w", r.AgentTimeout, err)
	}
	began := time.Now()
	res := <-inited
	if err := res.err; err != nil {
		c.Close()
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("init guest identity: guest agent did not answer within %s: %w", r.AgentTimeout, err)
		}
		return nil, fmt.Errorf("init guest identity: %w", err)
	}
	if !r.Deferred {
		rec.addWithin(PhaseInit, time.Since(began), res.phases)
	}
	return c, nil
}

// Claim gives the guest of a VM restored with Deferred, running since,
// its identity and what r.Guest holds, as Run would have; r's plan and
// agent timeout apply, its staged dir and VM settings are not used. On
// error the VM is left to the caller, who closes it with c.
func Claim(ctx context.Context, c *agent.Client, r Request) (Report, error) {
	start := time.Now()
	rec := &recorder{}
	phases, err := initGuest(ctx, c, r)
	if err != nil {
		return Report{}, fmt.Errorf("init guest identity: %w", err)
	}
	rec.addWithin(PhaseInit, time.Since(start), phases)
	return Report{Plan: r.Plan, Phases: rec.list(), Total: time.Since(start)}, nil
}

// initResult is how initGuest went.
type initResult struct {
	phases []agent.Phase
	err    error
}

// ErrVMExited is the cause of a restore that failed because its
// hypervisor process exited before the guest was up.
var ErrVMExited = errors.New("the hypervisor exited before the guest was up")

// vmExited is err, or the VM's exit when that ended ctx.
func vmExited(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); err != nil && errors.Is(cause, ErrVMExited) {
		return cause
	}
	return err
}

// whileRunning is ctx, cancelled with ErrVMExited if vm's process exits
// first: waiting for the agent of a dead VM is waiting for its whole
// timeout. stop ends the watch.
func whileRunning(ctx context.Context, vm hypervisor.VM) (_ context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := vm.Wait(ctx)
		if ctx.Err() != nil {
			return
		}
		how := "exit status 0"
		if err != nil {
			how = err.Error()
		}
		cancel(fmt.Errorf("%w: pid %d: %s", ErrVMExited, vm.PID(), how))
	}()
	return ctx, func() {
		cancel(context.Canceled)
		<-done
	}
}

// release unlinks the staged memory of a restore whose plan releases it
// (copy): the VM holds a private copy, and the link would only pin the
// snapshotter's flat file. It runs once the guest is up, so a restore that
// fails leaves the staged directory whole for a retry. A failed unlink
// costs cache space, not the running VM, so it is only logged: the link
// goes with the staged directory when the snapshotter removes it. The
// report has a release phase only if the link went.
func release(ctx context.Context, r Request, rec *recorder) {
	if !r.Plan.ReleaseAfterLoad {
		return
	}
	path := filepath.Join(r.StagedDir, chain.StagedMemory)
	l := log.G(ctx).WithField("staged", path)
	if err := rec.time(PhaseRelease, func() error { return os.Remove(path) }); err != nil {
		l.WithError(err).Warn("release staged memory after copy restore; it stays until the snapshot is removed")
		return
	}
	l.Debug("released staged memory after copy restore")
}

// initGuest gives a restored guest its own clock, randomness and name, and
// what r.Guest holds; the phases are the guest's steps, as it timed them.
func initGuest(ctx context.Context, c *agent.Client, r Request) ([]agent.Phase, error) {
	entropy := make([]byte, entropyBytes)
	if _, err := rand.Read(entropy); err != nil {
		return nil, fmt.Errorf("read entropy: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, r.AgentTimeout)
	defer cancel()
	req := agent.InitRequest{Time: time.Now(), Entropy: entropy, Hostname: r.Hostname, Files: r.Guest.Files, Rootfs: r.Guest.Rootfs,
		Process: r.Guest.Process, Sysctls: r.Guest.Sysctls, WarmContainers: r.Guest.WarmContainers, WarmOwnInit: r.Guest.WarmOwnInit}
	if r.Guest.Network != nil {
		req.Network = r.Guest.Network()
	}
	if r.Guest.BeforeInit != nil {
		if err := r.Guest.BeforeInit(ctx, c); err != nil {
			return nil, err
		}
	}
	return c.Init(ctx, req)
}

// recorder collects phases in the order they finish. Drivers may report
// from their own goroutines.
type recorder struct {
	mu     sync.Mutex
	phases []Phase
}

func (r *recorder) add(name string, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.phases = append(r.phases, Phase{Name: name, Duration: config.Duration(d)})
}

// time runs f and records its duration under name if it succeeds.
func (r *recorder) time(name string, f func() error) error {
	start := time.Now()
	if err := f(); err != nil {
		return err
	}
	r.add(name, time.Since(start))
	return nil
}

// addWithin records name, less the guest's steps within it, and then each
// of those as a phase of its own (GuestPhasePrefix and its name): the
// report shows where the guest's time went without counting it twice.
func (r *recorder) addWithin(name string, d time.Duration, guest []agent.Phase) {
	for _, p := range guest {
		d -= p.Duration
	}
	r.add(name, max(d, 0))
	for _, p := range guest {
		r.add(GuestPhasePrefix+p.Name, p.Duration)
	}
}

func (r *recorder) list() []Phase {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Phase(nil), r.phases...)
}

// String is the report on one line: each phase, then the total.
func (r Report) String() string {
	var b strings.Builder
	for _, p := range r.Phases {
		fmt.Fprintf(&b, "%s=%s ", p.Name, p.Duration.D().Round(time.Microsecond))
	}
	fmt.Fprintf(&b, "total=%s", r.Total.Round(time.Microsecond))
	return b.String()
}
