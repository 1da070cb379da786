package task

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
)

// PodVM is a pod's VM that containerd's sandbox API (sandboxer = "shim")
// asked this shim for: no task of its own, a VM its pod's containers
// join. It is recorded in its sandbox's bundle as a task's VM is, so `shim
// delete` of the sandbox cleans up after a crash.
type PodVM struct {
	id, bundle string
	sb         *Sandbox
	cg         VMCgroup // nil when the pod names no cgroup
	// Created is when StartPod began.
	Created time.Time

	done     chan struct{} // closed once the hypervisor exited
	exitedAt time.Time     // set before done closes
}

// PID is the pod VM's hypervisor process.
func (p *PodVM) PID() int { return p.sb.VM.PID() }

// Done is closed once the VM has exited.
func (p *PodVM) Done() <-chan struct{} { return p.done }

// ExitedAt is when the VM exited; zero while Done is open.
func (p *PodVM) ExitedAt() time.Time {
	select {
	case <-p.done:
		return p.exitedAt
	default:
		return time.Time{}
	}
}

// Stats reads the VM's cgroup: the pod's usage as the host sees it.
func (p *PodVM) Stats() (any, error) {
	if p.cg == nil {
		return nil, fmt.Errorf("pod %s has no cgroup (its config names no cgroup parent): %w", p.id, errdefs.ErrNotFound)
	}
	m, err := p.cg.Stats()
	if err != nil {
		return nil, fmt.Errorf("read cgroup stats of pod %s: %w", p.id, err)
	}
	return m, nil
}

// Update puts the pod's new limits (an in-place resize) on the VM's
// cgroup as a task's update does on its VM's: the CPU limits as given,
// memory as the pod's limit plus the hypervisor's headroom, refused when
// it is below the guest's memory.
func (p *PodVM) Update(res *specs.LinuxResources) error {
	vres, err := p.sb.Memory.vmResources(res)
	if err != nil {
		return fmt.Errorf("resize pod %s: %w", p.id, err)
	}
	if p.cg == nil {
		return fmt.Errorf("resize pod %s: it has no cgroup (its config names no cgroup parent): %w", p.id, errdefs.ErrFailedPrecondition)
	}
	if err := p.cg.Update(vres); err != nil {
		return fmt.Errorf("resize pod %s: update cgroup: %w", p.id, err)
	}
	return nil
}

// StartPod restores the VM of pod req.ID with no image of its own as its
// root (req.Bare) and makes it the host its pod's containers join: their
// tasks, which carry the pod's id as their sandbox id, run in it. As
// Create does for a task's VM, it records the VM in req.Bundle and puts it
// in the cgroup req.Spec names. On error nothing is left.
func (s *Service) StartPod(ctx context.Context, req LaunchRequest) (_ *PodVM, retErr error) {
	began := time.Now()
	if err := s.reserve(req.ID); err != nil {
		return nil, err
	}
	defer s.release(req.ID)
	req.Bare, req.Containerd = true, s.containerd
	if req.Namespace == "" {
		req.Namespace = s.namespace
	}
	markPodSandbox(&req)
	setup := newVMSetup(req, req.Spec)
	req.Starting, req.Spawned, req.Cgroup = setup.starting, setup.spawned, setup
	sb, err := s.launcher.Launch(ctx, req)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("restore the VM of pod %s: %w", req.ID, err), setup.release())
	}
	defer func() {
		if retErr != nil {
			discard(ctx, sb)
			retErr = errors.Join(retErr, setup.release())
		}
	}()
	if sb.Host == nil {
		return nil, fmt.Errorf("the VM of pod %s takes no containers: %w", req.ID, errdefs.ErrFailedPrecondition)
	}
	_, cg, err := setup.finish(sb)
	if err != nil {
		return nil, err
	}
	p := &PodVM{id: req.ID, bundle: req.Bundle, sb: sb, cg: cg, Created: began, done: make(chan struct{})}
	go p.watch()
	s.mu.Lock()
	s.pods[req.ID] = p
	s.mu.Unlock()
	log.G(ctx).WithFields(log.Fields{"id": req.ID, "pid": p.PID(), "took": time.Since(began)}).Info("pod VM started")
	return p, nil
}

// markPodSandbox makes req's spec a pod sandbox's, which the launcher
// gives a host for the pod's containers.
func markPodSandbox(req *LaunchRequest) {
	if req.Spec == nil {
		req.Spec = &specs.Spec{}
	}
	spec := *req.Spec
	spec.Annotations = maps.Clone(req.Spec.Annotations)
	if spec.Annotations == nil {
		spec.Annotations = map[string]string{}
	}
	spec.Annotations[containerTypeAnnotation] = containerTypeSandbox
	req.Spec = &spec
}

func (p *PodVM) watch() {
	if err := p.sb.VM.Wait(context.Background()); err != nil {
		log.L.WithError(err).WithField("id", p.id).Debug("pod VM wait")
	}
	p.exitedAt = time.Now()
	close(p.done)
}

// StopPod ends pod p: the containers still running in its VM are killed
// (each task reports its exit), then the VM, and the pod's network is
// given back. The VM's record and what it holds stay until RemovePod.
func (s *Service) StopPod(ctx context.Context, p *PodVM) error {
	s.mu.Lock()
	var members []*task
	for _, t := range s.tasks {
		if t.host != nil && t.host == p.sb.Host {
			members = append(members, t)
		}
	}
	s.mu.Unlock()
	for _, t := range members {
		t.killVM("its pod stops")
	}
	select {
	case <-p.done:
	default:
		if err := p.sb.VM.Kill(); err != nil {
			return fmt.Errorf("kill the VM of pod %s: %w", p.id, err)
		}
	}
	select {
	case <-p.done:
	case <-time.After(exitTimeout):
		return fmt.Errorf("the VM of pod %s still runs %s after SIGKILL: %w", p.id, exitTimeout, errdefs.ErrUnavailable)
	case <-ctx.Done():
		return ctx.Err()
	}
	if p.sb.Network != nil {
		if err := p.sb.Network.Release(); err != nil {
			return fmt.Errorf("release the network of pod %s: %w", p.id, err)
		}
	}
	return nil
}

// RemovePod stops pod p if it runs and releases all it holds: the VM, its
// base snapshot, cgroup and record. The shim goes on serving: the caller
// answers first, then lets it exit (ShutdownIfIdle).
func (s *Service) RemovePod(ctx context.Context, p *PodVM) error {
	if err := s.StopPod(ctx, p); err != nil {
		return err
	}
	if err := closeVM(p.sb, p.cg); err != nil {
		// The record stays, so `shim delete` can try again.
		return fmt.Errorf("release pod %s: %w", p.id, err)
	}
	if err := os.Remove(filepath.Join(p.bundle, state.TaskFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the record of pod %s: %w", p.id, err)
	}
	s.mu.Lock()
	delete(s.pods, p.id)
	s.mu.Unlock()
	return nil
}

// ShutdownIfIdle lets the shim exit if it serves no task and no pod VM.
func (s *Service) ShutdownIfIdle() { s.shutdownIfIdle() }
