package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"syscall"
	"time"

	"github.com/containerd/cgroups/v3/cgroup2/stats"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// apiVersion4 is the first agent API with the container calls.
const apiVersion4 = 4

// ContainerProcess is a container's process, or one of its execs, in the
// guest.
type ContainerProcess struct {
	ContainerID, ExecID string
	Pid                 uint32
	// Phases are how long the guest's steps of the container's create
	// took (the root, the bundle, runc's create), as the guest tells them:
	// only names the host knows, each at most the create's call time.
	Phases []Phase

	c               *Client
	terminal, stdin bool
}

// ContainerExit is how a container's process ended.
type ContainerExit struct {
	ExitStatus
	// OOMKilled says the OOM killer killed in the container's cgroup.
	OOMKilled bool
}

// CreateContainer has the guest's runc create container id from spec (its
// paths the guest's) over rootfs, a directory in the guest; its process
// waits for StartContainer.
func (c *Client) CreateContainer(ctx context.Context, id string, spec *specs.Spec, rootfs string, stdin bool) (*ContainerProcess, error) {
	return c.CreateContainerFrom(ctx, id, spec, ContainerRoot{Dir: rootfs}, stdin)
}

// ContainerRoot is where a container's root comes from: a directory in
// the guest, or a disk the host attached (a container joining a running
// VM), and the files the guest writes first.
type ContainerRoot struct {
	Dir string
	// Disk is mounted read-only under a private writable overlay; its
	// Mounts stay empty, runc makes the spec's. The guest unmounts it when
	// the container is deleted, and the host may then detach it.
	Disk *Rootfs
	// Files are the copies of the spec's bind sources; what one request
	// cannot carry goes first with UpdateFiles, as Init's.
	Files []File
	// Volumes are disks the guest mounts read-only, each at its Path,
	// for the spec's binds (agent API 7).
	Volumes []VolumeDisk
	// OwnInit has the guest's own container init make the container
	// rather than runc (agent API 14; an older guest uses runc).
	OwnInit bool
}

// VolumeDisk is a disk mounted read-only at Path in the guest: an image
// volume's filesystem on a disk slot.
type VolumeDisk struct {
	Serial, FSType, Path string
	Size                 uint64 // as Rootfs.Size
}

// CreateContainerFrom has the guest's runc create container id from spec
// over root; its process waits for StartContainer.
func (c *Client) CreateContainerFrom(ctx context.Context, id string, spec *specs.Spec, root ContainerRoot, stdin bool) (*ContainerProcess, error) {
	var err error
	if root.Files, err = c.sendAhead(ctx, root.Files); err != nil {
		return nil, fmt.Errorf("create container %q in guest: %w", id, err)
	}
	req, err := createContainerRequest(id, spec, root, stdin)
	if err != nil {
		return nil, err
	}
	if err := c.requireVersion(ctx, apiVersion4, "a container in the VM"); err != nil {
		return nil, fmt.Errorf("create container %q in guest: %w", id, err)
	}
	if len(root.Volumes) > 0 {
		if err := c.requireVersion(ctx, apiVersion7, "an image volume"); err != nil {
			return nil, fmt.Errorf("create container %q in guest: %w", id, err)
		}
	}
	if tmpfsIn(root.Files) {
		if err := c.requireVersion(ctx, apiVersion8, tmpfsNeeds); err != nil {
			return nil, fmt.Errorf("create container %q in guest: %w", id, err)
		}
	}
	began := time.Now()
	resp, err := c.api.CreateContainer(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("create container %q in guest: %w", id, native(err))
	}
	terminal := spec.Process != nil && spec.Process.Terminal
	return &ContainerProcess{ContainerID: id, Pid: resp.Pid, Phases: guestPhases(resp.Phases, api.CreatePhases, time.Since(began)),
		c: c, terminal: terminal, stdin: stdin || terminal}, nil
}

// Phase is how long one step in the guest took.
type Phase struct {
	Name     string
	Duration time.Duration
}

// guestPhases are the phases a guest told, if they are what the call
// has: names of order, once each and in it, none negative, together no
// longer than the call took. A guest that tells anything else is not
// believed: its phases are dropped whole, the report keeps the call's.
func guestPhases(in []*api.Phase, order []string, call time.Duration) []Phase {
	out := make([]Phase, 0, len(in))
	var total time.Duration
	next := 0
	for _, p := range in {
		i := slices.Index(order[next:], p.GetName())
		d := time.Duration(p.GetNanos())
		if i < 0 || d < 0 || total+d > call {
			return nil
		}
		next += i + 1
		total += d
		out = append(out, Phase{Name: p.GetName(), Duration: d})
	}
	return out
}

func createContainerRequest(id string, spec *specs.Spec, root ContainerRoot, stdin bool) (*api.CreateContainerRequest, error) {
	data, err := containerJSON(id, spec)
	if err != nil {
		return nil, err
	}
	req := &api.CreateContainerRequest{Id: id, Spec: data, Rootfs: root.Dir, Stdin: stdin, OwnInit: root.OwnInit}
	if req.Files, err = initFiles(root.Files); err != nil {
		return nil, fmt.Errorf("container %q: %w", id, err)
	}
	if root.Disk != nil {
		if req.RootDisk, err = initRootfs(root.Disk); err != nil {
			return nil, fmt.Errorf("container %q: %w", id, err)
		}
	}
	for _, v := range root.Volumes {
		req.VolumeDisks = append(req.VolumeDisks, &api.VolumeDisk{Serial: v.Serial, Fstype: v.FSType, Path: v.Path, Size: v.Size})
	}
	return req, nil
}

// containerJSON marshals v, bounded as the guest bounds it.
func containerJSON(id string, v any) ([]byte, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("container %q: marshal: %w", id, err)
	}
	if len(data) > api.MaxContainerSpec {
		return nil, fmt.Errorf("container %q: spec is %d bytes, the guest takes at most %d: %w", id, len(data), api.MaxContainerSpec, errdefs.ErrInvalidArgument)
	}
	return data, nil
}

// StartContainer starts the process of a created container.
func (c *Client) StartContainer(ctx context.Context, id string) (uint32, error) {
	resp, err := c.api.StartContainer(ctx, &api.ContainerRequest{Id: id})
	if err != nil {
		return 0, fmt.Errorf("start container %q in guest: %w", id, native(err))
	}
	return resp.Pid, nil
}

// ExecContainer runs p in running container id as execID.
func (c *Client) ExecContainer(ctx context.Context, id, execID string, p *specs.Process, stdin bool) (*ContainerProcess, error) {
	data, err := containerJSON(id, p)
	if err != nil {
		return nil, err
	}
	resp, err := c.api.ExecContainer(ctx, &api.ExecContainerRequest{Id: id, ExecId: execID, Process: data, Stdin: stdin})
	if err != nil {
		return nil, fmt.Errorf("exec %q in container %q in guest: %w", execID, id, native(err))
	}
	return &ContainerProcess{ContainerID: id, ExecID: execID, Pid: resp.Pid, c: c, terminal: p.Terminal, stdin: stdin || p.Terminal}, nil
}

// DeleteContainer removes a container whose process exited or never
// started; with execID, it forgets that exited exec.
func (c *Client) DeleteContainer(ctx context.Context, id, execID string) error {
	if _, err := c.api.DeleteContainer(ctx, &api.ContainerRequest{Id: id, ExecId: execID}); err != nil {
		return fmt.Errorf("delete container %q %s in guest: %w", id, execID, native(err))
	}
	return nil
}

// UpdateContainer changes a running container's resources.
func (c *Client) UpdateContainer(ctx context.Context, id string, r *specs.LinuxResources) error {
	data, err := containerJSON(id, r)
	if err != nil {
		return err
	}
	if _, err := c.api.UpdateContainer(ctx, &api.UpdateContainerRequest{Id: id, Resources: data}); err != nil {
		return fmt.Errorf("update container %q in guest: %w", id, native(err))
	}
	return nil
}

// ContainerStats reads the container's cgroup in the guest.
func (c *Client) ContainerStats(ctx context.Context, id string) (*stats.Metrics, error) {
	resp, err := c.api.ContainerStats(ctx, &api.ContainerRequest{Id: id})
	if err != nil {
		return nil, fmt.Errorf("stats of container %q in guest: %w", id, native(err))
	}
	var m stats.Metrics
	if err := resp.GetMetrics().UnmarshalTo(&m); err != nil {
		return nil, fmt.Errorf("stats of container %q in guest: %w", id, err)
	}
	return &m, nil
}

// Signal sends sig to the process (all of the container's with all);
// errdefs.ErrNotFound if it has exited.
func (p *ContainerProcess) Signal(ctx context.Context, sig syscall.Signal, all bool) error {
	if _, err := p.c.api.SignalContainer(ctx, &api.SignalContainerRequest{Id: p.ContainerID, ExecId: p.ExecID, Signal: uint32(sig), All: all}); err != nil {
		return fmt.Errorf("signal %s in guest: %w", p, native(err))
	}
	return nil
}

// Wait blocks until the process exits.
func (p *ContainerProcess) Wait(ctx context.Context) (ContainerExit, error) {
	resp, err := p.c.api.WaitContainer(ctx, p.request())
	if err != nil {
		return ContainerExit{}, fmt.Errorf("wait for %s in guest: %w", p, native(err))
	}
	return ContainerExit{
		ExitStatus: ExitStatus{Code: int(resp.ExitCode), Signal: int(resp.Signal), ExitedAt: resp.ExitedAt.AsTime()},
		OOMKilled:  resp.OomKilled,
	}, nil
}

// ResizePty sets the size of the process's terminal.
func (p *ContainerProcess) ResizePty(ctx context.Context, width, height uint32) error {
	if _, err := p.c.api.ResizeContainerPty(ctx, &api.ResizeContainerPtyRequest{Id: p.ContainerID, ExecId: p.ExecID, Width: width, Height: height}); err != nil {
		return fmt.Errorf("resize pty of %s in guest: %w", p, native(err))
	}
	return nil
}

// CloseStdin ends the process's stdin (on a terminal: sends end-of-file).
func (p *ContainerProcess) CloseStdin(ctx context.Context) error {
	if _, err := p.c.api.CloseContainerStdin(ctx, p.request()); err != nil {
		return fmt.Errorf("close stdin of %s in guest: %w", p, native(err))
	}
	return nil
}

// Stdio returns the process's streams, as Process.Stdio does.
func (p *ContainerProcess) Stdio() (stdin io.WriteCloser, stdout, stderr io.ReadCloser) {
	if p.stdin {
		stdin = newPusher(fmt.Sprintf("stdin of %s", p), func(ctx context.Context, data []byte) error {
			_, err := p.c.api.WriteContainerStdin(ctx, &api.WriteContainerStdinRequest{Id: p.ContainerID, ExecId: p.ExecID, Data: data})
			return err
		}, p.CloseStdin)
	}
	stdout = p.reader(api.Stream_STDOUT)
	if !p.terminal {
		stderr = p.reader(api.Stream_STDERR)
	}
	return stdin, stdout, stderr
}

func (p *ContainerProcess) reader(stream api.Stream) io.ReadCloser {
	return newPuller(fmt.Sprintf("%s of %s", stream, p), func(ctx context.Context, max uint32) (*api.ReadOutputResponse, error) {
		return p.c.api.ReadContainerOutput(ctx, &api.ReadContainerOutputRequest{Id: p.ContainerID, ExecId: p.ExecID, Stream: stream, MaxBytes: max})
	})
}

func (p *ContainerProcess) request() *api.ContainerRequest {
	return &api.ContainerRequest{Id: p.ContainerID, ExecId: p.ExecID}
}

// String names the process in errors.
func (p *ContainerProcess) String() string {
	if p.ExecID == "" {
		return fmt.Sprintf("container %q", p.ContainerID)
	}
	return fmt.Sprintf("exec %q of container %q", p.ExecID, p.ContainerID)
}
