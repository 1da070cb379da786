package task

import (
	"errors"
	"fmt"
	"sync"
	"syscall"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
)

// vmSetup is what Create does for a VM around its launch. Before it, the
// task's cgroup is made, without limits, for the launch to charge the
// guest's memory to and start the hypervisor in (it is the launch's
// hypervisor.Cgroup). As soon as the hypervisor process exists, while the
// guest is still coming up: persist the task record, so `shim delete` can
// kill the VM should this shim die from then on, and set the cgroup's
// limits (and move in a process a launcher started elsewhere). Both need
// nothing from the guest, so they overlap the guest's resume, agent and
// init instead of following them.
type vmSetup struct {
	req  LaunchRequest
	path string // the spec's cgroups path; "" for none
	res  *specs.LinuxResources

	once sync.Once
	done chan struct{}
	rec  *state.Task
	cg   VMCgroup
	err  error
	// bornIn: the launch started its hypervisor in cg (Start).
	bornIn bool
}

var _ hypervisor.Cgroup = (*vmSetup)(nil)

func newVMSetup(req LaunchRequest, spec *specs.Spec) *vmSetup {
	s := &vmSetup{req: req, done: make(chan struct{})}
	if spec.Linux != nil {
		s.path, s.res = spec.Linux.CgroupsPath, spec.Linux.Resources
	}
	return s
}

// starting records what a launch is about to create (sp without a pid),
// before it exists, then makes the cgroup; it is the LaunchRequest's
// Starting hook. A shim killed before spawned records the pid leaves
// `shim delete` this record: the run dir (which the hypervisor's command
// line names), the tap, the base snapshot and the cgroup.
func (s *vmSetup) starting(sp Spawn) error {
	rec, err := newRecord(s.req, sp)
	if err != nil {
		return err
	}
	rec.Cgroup = s.path
	if err := state.WriteTask(s.req.Bundle, rec); err != nil || s.path == "" {
		return err
	}
	s.cg, err = NewCgroup(s.path, &specs.LinuxResources{})
	return err
}

// Charge runs fill in the task's cgroup, if it has one.
func (s *vmSetup) Charge(fill func() error) error {
	if s.cg == nil {
		return fill()
	}
	return s.cg.Charge(fill)
}

// Start starts the hypervisor in the task's cgroup, if it has one.
func (s *vmSetup) Start(attr *syscall.SysProcAttr, start func() error) error {
	if s.cg == nil {
		return start()
	}
	if err := s.cg.Start(attr, start); err != nil {
		return err
	}
	s.bornIn = true
	return nil
}

// spawned starts the setup of sp's VM in the background; it is the
// LaunchRequest's Spawned hook.
func (s *vmSetup) spawned(sp Spawn) {
	s.once.Do(func() { go s.run(sp) })
}

// finish waits for the setup of sb's VM, running it now if the launcher
// never reported the spawn.
func (s *vmSetup) finish(sb *Sandbox) (*state.Task, VMCgroup, error) {
	s.once.Do(func() { s.run(spawnOf(sb)) })
	<-s.done
	return s.rec, s.cg, s.err
}

// release waits for a setup that may have begun and removes the cgroup it
// made; the VM must be gone.
func (s *vmSetup) release() error {
	s.once.Do(func() { close(s.done) })
	<-s.done
	if s.cg == nil {
		return nil
	}
	if err := s.cg.Delete(); err != nil {
		return fmt.Errorf("delete cgroup %s: %w", s.path, err)
	}
	return nil
}

func (s *vmSetup) run(sp Spawn) {
	defer close(s.done)
	s.rec, s.err = newRecord(s.req, sp)
	if s.err != nil {
		return
	}
	// Recorded before it exists, so no crash can leave it unrecorded.
	s.rec.Cgroup = s.path
	if s.err = state.WriteTask(s.req.Bundle, s.rec); s.err != nil || s.path == "" {
		return
	}
	if s.cg == nil {
		s.cg, s.err = joinCgroup(s.path, s.res, sp)
		return
	}
	s.err = s.limit(sp)
}

// limit sets the limits of the cgroup made at starting, now that the
// guest's memory and the hypervisor are in it, and moves in a hypervisor
// the launch started outside it (a pod's pause process).
func (s *vmSetup) limit(sp Spawn) error {
	vres, err := sp.Memory.vmResources(s.res)
	if err != nil {
		return err
	}
	if err := s.cg.Update(vres); err != nil {
		return fmt.Errorf("set the limits of cgroup %s (its VM may already use more memory than the limit): %w", s.path, err)
	}
	if s.bornIn {
		return nil
	}
	if err := s.cg.Add(sp.PID); err != nil {
		return fmt.Errorf("move hypervisor into cgroup %s: %w", s.path, err)
	}
	return nil
}

// newRecord is the task record of sp; without a pid (nothing spawned
// yet) it names only what the launch will create.
func newRecord(req LaunchRequest, sp Spawn) (*state.Task, error) {
	var start uint64
	if sp.PID != 0 {
		var err error
		if start, err = state.StartTime(sp.PID); err != nil {
			return nil, fmt.Errorf("identify hypervisor process: %w", err)
		}
	}
	return &state.Task{
		ID:         req.ID,
		Hypervisor: sp.Hypervisor,
		PID:        sp.PID,
		PIDStart:   start,
		RunDir:     sp.RunDir,
		StagedDir:  req.StagedDir,
		Network:    sp.Network,
		Base:       sp.Base,
		PoolBase:   sp.PoolBase,
		Plan:       sp.Plan,
	}, nil
}

// joinCgroup creates the cgroup at path with the VM's share of res and
// moves the hypervisor into it.
func joinCgroup(path string, res *specs.LinuxResources, sp Spawn) (VMCgroup, error) {
	vres, err := sp.Memory.vmResources(res)
	if err != nil {
		return nil, err
	}
	cg, err := NewCgroup(path, vres)
	if err != nil {
		return nil, err
	}
	if err := cg.Add(sp.PID); err != nil {
		return nil, errors.Join(fmt.Errorf("move hypervisor into cgroup %s: %w", path, err), cg.Delete())
	}
	return cg, nil
}
