package soak

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/pelletier/go-toml/v2"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
)

// The annotations containerd's CRI gives a pod's sandbox and containers,
// by which the shim puts a pod's containers into the VM its sandbox's task
// restores (shim.pod_vm = "pod") and into one shim.
const (
	containerTypeAnnotation = "io.kubernetes.cri.container-type"
	sandboxIDAnnotation     = "io.kubernetes.cri.sandbox-id"
)

// podRole is a container's part in a pod: its sandbox, or one of its
// containers.
type podRole struct {
	sandbox string // the pod's sandbox id
	kind    string // "sandbox" or "container"
}

func (p *podRole) annotations() map[string]string {
	return map[string]string{containerTypeAnnotation: p.kind, sandboxIDAnnotation: p.sandbox}
}

// podRun is a pod's sandbox and containers as the soak runs them, each a
// run of its own: the sandbox first, then podMembers containers joining
// its VM; one of them is killed and a new container joins in its place,
// another runs an exec.
type podRun struct {
	s    *soak
	plan Plan
	runs []*run // the sandbox first
}

// podMembers is how many containers a pod's VM holds at once.
const podMembers = 2

// PodDiskSlots are the disk slots to bake the pods' base snapshot with:
// one per container of a pod alive at once, and one for a replacement
// that joins while the slot it takes the place of is let go.
const PodDiskSlots = podMembers + 1

// runPod runs pod plan p through containerd and removes everything it made.
func (s *soak) runPod(ctx context.Context, p Plan) Outcome {
	start := time.Now()
	pr := &podRun{s: s, plan: p}
	err := pr.lifecycle(ctx)
	var cleanup []error
	// Containers before their sandbox, whose VM they are in.
	for _, r := range slices.Backward(pr.runs) {
		cleanup = append(cleanup, r.cleanup())
	}
	var steps []Step
	for _, r := range pr.runs {
		who := strings.TrimPrefix(r.plan.ID[len(p.ID):], "-")
		if who == "" {
			who = "sandbox"
		}
		for _, st := range r.steps {
			steps = append(steps, Step{Name: who + " " + st.Name, Took: st.Took})
		}
	}
	return Outcome{Plan: p, Err: errors.Join(append(cleanup, err)...), Took: time.Since(start), Steps: steps}
}

// add starts a container of the pod: its sandbox (kind "sandbox") or one
// joining the sandbox's VM.
func (pr *podRun) add(ctx context.Context, suffix, kind string) (*run, error) {
	plan := pr.plan
	plan.ID += suffix
	r := &run{s: pr.s, plan: plan, last: time.Now(), pod: &podRole{sandbox: pr.plan.ID, kind: kind}}
	pr.runs = append(pr.runs, r)
	if err := r.createContainer(ctx); err != nil {
		return nil, fmt.Errorf("%s %s: %w", kind, plan.ID, err)
	}
	if err := r.createTask(ctx); err != nil {
		return nil, fmt.Errorf("%s %s: %w", kind, plan.ID, err)
	}
	r.step("create")
	if err := r.task.Start(ctx); err != nil {
		return nil, fmt.Errorf("%s %s: start task: %w", kind, plan.ID, err)
	}
	r.step("start")
	return r, nil
}

// lifecycle starts the sandbox and its containers, kills one and starts a
// new one in its place, execs in another, then stops the containers and
// the sandbox, checking what each printed.
func (pr *podRun) lifecycle(ctx context.Context) error {
	sandbox, err := pr.add(ctx, "", "sandbox")
	if err != nil {
		return err
	}
	var members []*run
	for i := range podMembers {
		m, err := pr.add(ctx, fmt.Sprintf("-c%d", i), "container")
		if err != nil {
			return err
		}
		members = append(members, m)
	}
	if err := pr.replace(ctx, members[0]); err != nil {
		return err
	}
	if err := members[1].exec(ctx); err != nil {
		return fmt.Errorf("container %s: %w", members[1].plan.ID, err)
	}
	for _, r := range append(slices.Clone(pr.runs[1:]), sandbox) {
		if r.task == nil {
			continue
		}
		if err := r.finish(ctx); err != nil {
			return fmt.Errorf("%s %s: %w", r.pod.kind, r.plan.ID, err)
		}
	}
	return nil
}

// replace kills container m once it runs, removes it, and starts a new
// container in the pod's VM in its place, as kubelet restarts a crashed
// container.
func (pr *podRun) replace(ctx context.Context, m *run) error {
	if err := m.waitOutput(ctx); err != nil {
		return fmt.Errorf("container %s: %w", m.plan.ID, err)
	}
	if err := m.task.Kill(ctx, syscall.SIGKILL); err != nil {
		return fmt.Errorf("container %s: kill: %w", m.plan.ID, err)
	}
	st, err := waitStatus(ctx, m.exited)
	if err == nil && st.ExitCode() != 128+uint32(syscall.SIGKILL) {
		err = fmt.Errorf("exited %d, want %d", st.ExitCode(), 128+uint32(syscall.SIGKILL))
	}
	if err != nil {
		return fmt.Errorf("container %s killed: %w", m.plan.ID, err)
	}
	if err := m.cleanup(); err != nil {
		return fmt.Errorf("remove container %s: %w", m.plan.ID, err)
	}
	m.task, m.container = nil, nil
	_, err = pr.add(ctx, m.plan.ID[len(pr.plan.ID):]+"-again", "container")
	return err
}

// writePodConfig writes the shims' config with one VM per pod, restored
// from the pod image (which has disk slots for the pod's containers), and
// returns the runtime options that name it.
func (s *soak) writePodConfig() (*runtimeoptions.Options, error) {
	cfg := stackConfig(s.opts)
	cfg.Shim.PodVM = config.PodVMPod
	cfg.Restore.BaseImage = s.opts.PodImage.Ref
	data, err := toml.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("pod config: %w", err)
	}
	path := filepath.Join(s.stack.Dir, "pod-vm.toml")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return nil, fmt.Errorf("pod config: %w", err)
	}
	return &runtimeoptions.Options{ConfigPath: path}, nil
}
