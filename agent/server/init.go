package server

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/server/guestfile"
)

// diskWait bounds the wait for the rootfs disk when Init has no deadline.
const diskWait = 10 * time.Second

// warmTimeout bounds Init's warm-up of runc, which nothing waits for: at
// idle priority it runs only while the guest has nothing else to run.
const warmTimeout = 30 * time.Second

// initPlan is a checked InitRequest.
type initPlan struct {
	files   []*api.File
	network *NetConfig
	rootfs  *api.Rootfs
	sysctls []sysctl
}

// Init gives the guest its clone identity (clock, entropy, hostname), sets
// its sysctls, then writes its files, configures its NIC, mounts its container root and
// prepares its process, in that order; a pod's VM then warms its runc
// while the host goes on. It first detaches the processes the
// clone inherited from its snapshot (detachAll). Everything is checked
// before anything changes, but the process, whose program and cwd are
// looked up in the root; an error names the step that failed.
func (s *Service) Init(ctx context.Context, r *api.InitRequest) (*api.InitResponse, error) {
	plan, err := s.planInit(r)
	if err != nil {
		return nil, err
	}
	s.initMu.Lock()
	defer s.initMu.Unlock()
	s.detachAll()
	clk := api.NewClock()
	// A step with a phase ends it: lapped when the step had something to
	// do, left out when not. rootfs laps its own (rootfs, confine).
	for _, step := range []struct {
		name, phase string
		has         bool
		run         func() error
	}{
		{"clock", "", true, func() error { return s.setClock(r) }},
		{"entropy", "", true, func() error { return s.addEntropy(r) }},
		{"hostname", api.PhaseIdentity, true, func() error { return s.setHostname(r) }},
		{"sysctls", api.PhaseSysctls, len(plan.sysctls) > 0, func() error { return s.setSysctls(plan.sysctls) }},
		{"files", api.PhaseFiles, len(plan.files) > 0, func() error { return s.writeFiles(plan.files) }},
		{"network", api.PhaseNetwork, s.networkWork(plan.network), func() error { return s.configureNetwork(plan.network) }},
		{"rootfs", "", true, func() error { return s.setupRootfs(ctx, plan.rootfs, clk) }},
		{"process", api.PhaseProcess, r.Process != nil, func() error { return s.prepare(r.Process) }},
	} {
		if err := step.run(); err != nil {
			return nil, fmt.Errorf("init %s: %w", step.name, err)
		}
		switch {
		case step.phase == "":
		case step.has:
			clk.Lap(step.phase)
		default:
			clk.Skip()
		}
	}
	if r.WarmContainers {
		go s.warmContainers(r.WarmOwnInit)
	}
	if debugging() {
		log.G(ctx).WithFields(log.Fields{
			"hostname": r.Hostname, "entropy": len(r.Entropy), "files": len(r.Files),
			"network": r.Network != nil, "rootfs": r.Rootfs != nil, "process": r.Process.GetId(),
		}).Debug("guest initialized")
	}
	return &api.InitResponse{Version: Version, Phases: clk.Phases()}, nil
}

// warmContainers has the guest's runc, or with own the agent's own
// container init, create and delete a throwaway container, after Init
// has answered (InitRequest.warm_containers); it is best effort, so a
// failure is only logged.
func (s *Service) warmContainers(own bool) {
	ctx, cancel := context.WithTimeout(context.Background(), warmTimeout)
	defer cancel()
	if err := s.RPC.Warm(ctx, own); err != nil {
		log.G(ctx).WithError(err).WithField("own_init", own).Warn("warm the guest's container path")
	}
}

func (s *Service) planInit(r *api.InitRequest) (*initPlan, error) {
	plan := &initPlan{rootfs: r.Rootfs}
	if r.Time != nil {
		if err := r.Time.CheckValid(); err != nil {
			return nil, fmt.Errorf("init clock: %v: %w", err, errdefs.ErrInvalidArgument)
		}
	}
	var err error
	if plan.sysctls, err = checkSysctls(r.Sysctls); err != nil {
		return nil, fmt.Errorf("init sysctls: %w", err)
	}
	if plan.files, err = guestfile.Check(r.Files); err != nil {
		return nil, fmt.Errorf("init files: %w", err)
	}
	if r.Network != nil {
		if plan.network, err = parseNetwork(r.Network); err != nil {
			return nil, fmt.Errorf("init network: %w", err)
		}
	}
	if r.Rootfs != nil {
		if err := checkRootfs(r.Rootfs); err != nil {
			return nil, fmt.Errorf("init rootfs: %w", err)
		}
	}
	if r.Process != nil {
		if _, err := checkExec(r.Process); err != nil {
			return nil, fmt.Errorf("init process: %w", err)
		}
	}
	return plan, nil
}

func (s *Service) setClock(r *api.InitRequest) error {
	if r.Time == nil {
		return nil
	}
	return s.sys.SetTime(r.Time.AsTime())
}

func (s *Service) addEntropy(r *api.InitRequest) error {
	if len(r.Entropy) == 0 {
		return nil
	}
	return s.sys.AddEntropy(r.Entropy)
}

func (s *Service) setHostname(r *api.InitRequest) error {
	if r.Hostname == "" {
		return nil
	}
	return s.sys.SetHostname(r.Hostname)
}

func (s *Service) setSysctls(sysctls []sysctl) error {
	for _, c := range sysctls {
		if err := s.sys.SetSysctl(c.key, c.value); err != nil {
			return err
		}
	}
	return nil
}

// writeFiles writes files, and forgets the guest's root as the boot left
// it if they change what the agent read of it.
func (s *Service) writeFiles(files []*api.File) error {
	if b := s.boot.Load(); b != nil {
		for _, f := range files {
			if b.covers(f.Path) {
				s.boot.Store(nil)
				break
			}
		}
	}
	return guestfile.Write(files)
}

// networkWork says whether configureNetwork(cfg) has work: a network to
// give, or a NIC to take down that may not be down (a process ran since),
// which the network phase then times too.
func (s *Service) networkWork(cfg *NetConfig) bool {
	return cfg != nil || (s.net != nil && !s.nicDown.Load())
}

// configureNetwork gives the NIC cfg; nil takes the NIC down, which an
// agent managing no NIC, or a NIC down since boot or the last Init, has
// nothing to do for: a restored clone then spends nothing on it.
func (s *Service) configureNetwork(cfg *NetConfig) error {
	if s.net == nil {
		if cfg == nil {
			return nil
		}
		return fmt.Errorf("this agent manages no NIC: %w", errdefs.ErrFailedPrecondition)
	}
	if cfg == nil && s.nicDown.Load() {
		return nil
	}
	s.nicDown.Store(false)
	if err := s.net.Configure(cfg); err != nil {
		return err
	}
	s.nicDown.Store(cfg == nil)
	return nil
}
