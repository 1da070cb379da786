package task

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/containerd/v2/pkg/stdio"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
)

// InitGuestID names the init process to the guest agent; execs are
// "exec-" + their exec id, so the two can never collide.
const InitGuestID = "init"

// Create restores the task's VM from the staged chain; the init process
// runs only at Start.
func (s *Service) Create(ctx context.Context, r *taskAPI.CreateTaskRequest) (*taskAPI.CreateTaskResponse, error) {
	pid, err := s.create(ctx, r)
	if err != nil {
		return nil, err
	}
	return &taskAPI.CreateTaskResponse{Pid: uint32(pid)}, nil
}

func (s *Service) create(ctx context.Context, r *taskAPI.CreateTaskRequest) (int, error) {
	began := time.Now()
	if r.Checkpoint != "" {
		return 0, fmt.Errorf("create from checkpoint %s: a checkpoint restores as a snapshot image through the cocoon snapshotter, not as a task checkpoint: %w", r.Checkpoint, errdefs.ErrInvalidArgument)
	}
	if err := s.reserve(r.ID); err != nil {
		return 0, err
	}
	defer s.release(r.ID)
	spec, err := readSpec(r.Bundle)
	if err != nil {
		return 0, err
	}
	if err := refuseHostNamespaces(r.ID, spec); err != nil {
		return 0, err
	}
	if err := guestLSM(r.ID, spec); err != nil {
		return 0, err
	}
	init, err := initProcess(spec, r)
	if err != nil {
		return 0, err
	}
	host := s.podHost(spec)
	req, err := launchRequest(s.namespace, spec, r, host == nil)
	if err != nil {
		return 0, err
	}
	req.Containerd = s.containerd
	req.Process = &init.spec
	if host == nil {
		req.Sysctls = s.guestSysctls(spec)
	}
	h, err := newOCIHooks(req)
	if err != nil {
		return 0, err
	}
	if h.hasCreateHooks() {
		req.Created = h.created
	}
	var t *task
	if host != nil {
		t, err = s.join(ctx, host, req, init, began)
	} else {
		t, err = s.launch(ctx, req, spec, init, began)
	}
	if err != nil {
		return 0, err
	}
	t.hooks, t.seccomp = h, seccompOf(spec)
	if IsPodSandbox(spec) {
		t.sysctls = sysctlsOf(spec)
	}
	s.mu.Lock()
	s.tasks[r.ID] = t
	s.mu.Unlock()
	s.send(&eventstypes.TaskCreate{
		ContainerID: r.ID,
		Bundle:      r.Bundle,
		Rootfs:      r.Rootfs,
		IO:          &eventstypes.TaskIO{Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr, Terminal: r.Terminal},
		Pid:         uint32(t.pid()),
	})
	t.run()
	return t.pid(), nil
}

// reserve claims id for a Create in flight, so two creates of one id
// cannot both restore a VM.
func (s *Service) reserve(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, exists := s.tasks[id]
	_, creating := s.creating[id]
	if exists || creating {
		return fmt.Errorf("task %s: %w", id, errdefs.ErrAlreadyExists)
	}
	s.creating[id] = struct{}{}
	return nil
}

func (s *Service) release(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.creating, id)
}

// launch restores the VM, records it in the bundle and puts it in its
// cgroup, the latter two while the guest comes up (vmSetup). On error the
// VM and its cgroup are gone. The report's phases are the create's from
// began: reading the bundle, the launcher's, then what is left of the
// setup once the guest is up.
func (s *Service) launch(ctx context.Context, req LaunchRequest, spec *specs.Spec, init *process, began time.Time) (_ *task, retErr error) {
	phases := []state.Phase{{Name: PhaseBundle, Duration: config.Duration(time.Since(began))}}
	setup := newVMSetup(req, spec)
	req.Starting, req.Spawned, req.Cgroup = setup.starting, setup.spawned, setup
	sb, err := s.launcher.Launch(ctx, req)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("restore VM: %w", err), setup.release())
	}
	defer func() {
		if retErr != nil {
			discard(ctx, sb)
			retErr = errors.Join(retErr, setup.release())
		}
	}()
	finishing := time.Now()
	rec, cg, err := setup.finish(sb)
	if err != nil {
		return nil, err
	}
	phases = append(append(phases, sb.Phases...), state.Phase{Name: PhaseRecord, Duration: config.Duration(time.Since(finishing))})
	t := newTask(ctx, req.ID, req.Bundle, sb, rec, init, s.send)
	t.cg, t.created, t.namespace, t.phases = cg, began, req.Namespace, phases
	// Start writes the report again, with its phase; this first one, for a
	// task never started, need not hold up Create's answer (a file written
	// and renamed costs half a millisecond here).
	t.reports.Go(func() { t.saveReport(context.WithoutCancel(ctx)) })
	return t, nil
}

// discard kills and releases a sandbox that will not become a task.
func discard(ctx context.Context, sb *Sandbox) {
	if err := errors.Join(sb.VM.Kill(), sb.Guest.Close(), sb.VM.Close(), releaseHeld(sb)); err != nil {
		log.G(ctx).WithError(err).Warn("release VM of a failed create")
	}
}

// closeVM lets go of a VM that is gone: it closes sb's guest connection
// and VM, releases what sb holds and deletes the VM's cgroup cg (nil when
// there is none), naming each failure.
func closeVM(sb *Sandbox, cg VMCgroup) error {
	var errs []error
	if err := sb.Guest.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close guest agent: %w", err))
	}
	if err := sb.VM.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close VM: %w", err))
	}
	if err := releaseHeld(sb); err != nil {
		errs = append(errs, err)
	}
	if cg != nil {
		if err := cg.Delete(); err != nil {
			errs = append(errs, fmt.Errorf("delete cgroup: %w", err))
		}
	}
	return errors.Join(errs...)
}

// releaseHeld lets go of what sb holds besides its VM, which must be gone:
// its network and its base snapshot. Both releases are idempotent, so a
// network already given back at the init's exit is not released twice.
func releaseHeld(sb *Sandbox) error {
	var errs []error
	if sb.Network != nil {
		if err := sb.Network.Release(); err != nil {
			errs = append(errs, fmt.Errorf("release VM network: %w", err))
		}
	}
	if sb.Base != nil {
		if err := sb.Base.Release(); err != nil {
			errs = append(errs, fmt.Errorf("release base snapshot: %w", err))
		}
	}
	return errors.Join(errs...)
}

func readSpec(bundle string) (*specs.Spec, error) {
	data, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("read bundle spec: %w", err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, fmt.Errorf("decode bundle spec: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	return &spec, nil
}

func initProcess(spec *specs.Spec, r *taskAPI.CreateTaskRequest) (*process, error) {
	ps, err := guestProcess(InitGuestID, spec.Process, seccompOf(spec), r.Terminal, r.Stdin != "")
	if err != nil {
		return nil, err
	}
	// A pod's pause holds the PID namespace the pod's containers share,
	// as under runc; a sandbox on the host (no pod VM) ignores this.
	ps.OwnPIDNamespace = IsPodSandbox(spec) && ownsPIDNamespace(spec)
	sio := stdio.Stdio{Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr, Terminal: r.Terminal}
	return newProcess("", ps, sio), nil
}

// seccompOf is spec's seccomp profile; nil for none.
func seccompOf(spec *specs.Spec) *specs.LinuxSeccomp {
	if spec.Linux == nil {
		return nil
	}
	return spec.Linux.Seccomp
}

// guestProcess turns an OCI process into what the agent runs, under the
// container's seccomp profile (nil: none). A container in a pod's VM
// ignores the profile here: the guest's runc applies its spec's.
func guestProcess(id string, p *specs.Process, profile *specs.LinuxSeccomp, terminal, stdin bool) (ProcessSpec, error) {
	if p == nil || len(p.Args) == 0 {
		return ProcessSpec{}, fmt.Errorf("process %s has no args: %w", id, errdefs.ErrInvalidArgument)
	}
	cwd := p.Cwd
	if cwd == "" {
		cwd = "/"
	}
	return ProcessSpec{
		ID:              id,
		Args:            p.Args,
		Env:             p.Env,
		Cwd:             cwd,
		UID:             p.User.UID,
		GID:             p.User.GID,
		AdditionalGIDs:  p.User.AdditionalGids,
		Terminal:        terminal,
		Stdin:           stdin,
		Rlimits:         p.Rlimits,
		NoNewPrivileges: p.NoNewPrivileges,
		Umask:           p.User.Umask,
		Capabilities:    p.Capabilities,
		Seccomp:         profile,
	}, nil
}

// launchRequest is what Create launches r with. withConfig reads the
// runtime options' config, which a container joining its pod's VM does
// without: the VM runs with the pod's. (Its options may not even be its
// handler's: containerd's client sends a task bound to a sandbox API
// endpoint runc's options.)
func launchRequest(ns string, spec *specs.Spec, r *taskAPI.CreateTaskRequest, withConfig bool) (LaunchRequest, error) {
	var (
		staged string
		image  *chain.StagedRootfs
	)
	var err error
	staged, image, err = rootfsOf(r.Rootfs, r.Bundle)
	if IsPodSandbox(spec) {
		// A sandbox's image is its VM's root only when the pod gets a VM
		// (shim.pod_vm = "pod"), which then wants it; a pause process on
		// the host uses none, from whichever snapshotter.
		staged, err = "", nil
	}
	if err != nil {
		return LaunchRequest{}, err
	}
	var configPath, configBody string
	if withConfig {
		if configPath, configBody, err = configOf(r); err != nil {
			return LaunchRequest{}, err
		}
	}
	hostname, err := hostnameOf(spec, r.ID)
	if err != nil {
		return LaunchRequest{}, err
	}
	return LaunchRequest{
		ID: r.ID, Namespace: ns, Bundle: r.Bundle, Spec: spec,
		StagedDir: staged, Rootfs: image, ConfigPath: configPath, ConfigBody: configBody, Hostname: hostname,
	}, nil
}

// rootfsOf reads what the snapshotter staged for the task: a snapshot
// image's staged chain (one bind mount), or an ordinary image's filesystem
// image (the overlay containerd's overlay snapshotter would give, whose
// upper dir's parent holds it). The shim reads them in place rather than
// mounting them on bundle/rootfs: the hypervisor only opens files there,
// and a mount would be one more thing for a crashed shim to leak. Without
// mounts, the client mounted bundle/rootfs itself.
func rootfsOf(mounts []*types.Mount, bundle string) (string, *chain.StagedRootfs, error) {
	switch {
	case len(mounts) == 0:
		return filepath.Join(bundle, "rootfs"), nil, nil
	case len(mounts) == 1 && isBind(mounts[0]):
		return mounts[0].Source, nil, nil
	case len(mounts) == 1 && mounts[0].Type == "overlay":
		dir, err := chain.StagedRootfsDir(mounts[0].Options)
		if err == nil {
			var img *chain.StagedRootfs
			if img, err = chain.OpenStagedRootfs(dir); err == nil {
				return "", img, nil
			}
		}
		return "", nil, fmt.Errorf("rootfs overlay has no filesystem image staged by the cocoon snapshotter (run the task with --snapshotter cocoon): %w: %w", err, errdefs.ErrInvalidArgument)
	}
	kinds := make([]string, 0, len(mounts))
	for _, m := range mounts {
		kinds = append(kinds, m.Type)
	}
	return "", nil, fmt.Errorf("rootfs is %d mount(s) of type %v, want what the cocoon snapshotter stages (one bind or overlay mount): run the task with --snapshotter cocoon: %w",
		len(mounts), kinds, errdefs.ErrInvalidArgument)
}

func isBind(m *types.Mount) bool {
	if m.Type == "bind" || m.Type == "rbind" {
		return true
	}
	return slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind")
}

// configOf reads the runtime options (io.containerd.runtime.v1.Options,
// what ctr --runtime-config-path and a CRI runtime class send): a config
// file's path, or the config inline. containerd's CRI plugin sends a
// handler's options table as ConfigBody when it has no ConfigPath, so
// `options = { restore = { mode = "copy" } }` is a config of its own, and
// a mistyped key fails like one in a file.
func configOf(r *taskAPI.CreateTaskRequest) (path, body string, err error) {
	if r.Options == nil {
		return "", "", nil
	}
	return RuntimeConfig(r.Options)
}

// RuntimeConfig reads runtime options (io.containerd.runtime.v1.Options)
// as configOf does: a config file's path, or the config inline; none for
// empty options. The sandbox API's pod VMs read theirs with it too.
func RuntimeConfig(options typeurl.Any) (path, body string, err error) {
	if options == nil || len(options.GetValue()) == 0 {
		return "", "", nil
	}
	v, err := typeurl.UnmarshalAny(options)
	if err != nil {
		return "", "", fmt.Errorf("decode runtime options: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	opts, ok := v.(*runtimeoptions.Options)
	if !ok {
		return "", "", fmt.Errorf("runtime options are %T, want io.containerd.runtime.v1.Options: %w", v, errdefs.ErrInvalidArgument)
	}
	if opts.ConfigPath != "" && opts.ConfigBody != nil {
		return "", "", fmt.Errorf("runtime options set both ConfigPath and a config body: want one: %w", errdefs.ErrInvalidArgument)
	}
	return opts.ConfigPath, string(opts.ConfigBody), nil
}
