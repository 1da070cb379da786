// Package manager is the shim binary's lifecycle half (containerd pkg/shim's
// Shim interface): `start` spawns the long-running task server and returns
// its socket, `delete` cleans up after a task whose server is gone, and
// `-info` describes the runtime.
package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"syscall"

	bootapi "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	"github.com/containerd/containerd/api/types"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/containerd/v2/defaults"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
)

// Name is the runtime name containerd knows this shim by.
const Name = "io.containerd.cocoon.v2"

// Annotations that put several tasks into one shim process (each task
// still gets its own VM); see groupOf for the rule.
const (
	// AnnotationSandboxID is set by containerd's CRI plugin on a pod's
	// sandbox and on each of its containers.
	AnnotationSandboxID = "io.kubernetes.cri.sandbox-id"
	// AnnotationGroup groups tasks that are not in a pod (ctr, nerdctl,
	// the containerd client).
	AnnotationGroup = "io.cocoon.group"
)

// Manager implements shim.Shim for cocoon.
type Manager struct {
	name string
}

var _ shim.Shim = (*Manager)(nil)

// New returns the manager for the runtime called name.
func New(name string) *Manager {
	return &Manager{name: name}
}

// Name is the runtime name.
func (m *Manager) Name() string { return m.name }

// Start spawns the task server for params.InstanceID, or returns the address
// of the server already running for the task's group.
func (m *Manager) Start(ctx context.Context, params *bootapi.BootstrapParams) (_ *bootapi.BootstrapResult, retErr error) {
	result := &bootapi.BootstrapResult{Version: 3, Protocol: "ttrpc"}
	id := params.GetInstanceID()
	group, err := groupOf(id, "config.json")
	if err != nil {
		return nil, err
	}
	socketDir := params.GetSocketDir()
	if socketDir == "" {
		socketDir = filepath.Join(defaults.DefaultStateDir, "s")
	}
	sock, err := listen(ctx, socketDir, params.GetContainerdGrpcAddress(), group)
	if errors.Is(err, errdefs.ErrAlreadyExists) {
		result.Address = sock.addr
		return result, nil
	}
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			sock.Close()
		}
	}()
	debugLog := params.GetLogLevel() <= bootapi.LogLevel_LOG_LEVEL_DEBUG
	cmd, err := serverCommand(ctx, id, params.GetContainerdGrpcAddress(), debugLog)
	if err != nil {
		return nil, err
	}
	cmd.ExtraFiles = append(cmd.ExtraFiles, sock.f)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start shim server: %w", err)
	}
	// The server outlives this process; reap it if it dies while we still run.
	go func() { _ = cmd.Wait() }()
	if err := shim.AdjustOOMScore(cmd.Process.Pid); err != nil {
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("adjust shim server OOM score: %w", err)
	}
	result.Address = sock.addr
	return result, nil
}

// serverCommand re-executes this binary as the long-running task server.
func serverCommand(ctx context.Context, id, containerdAddress string, debugLog bool) (*exec.Cmd, error) {
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find shim binary: %w", err)
	}
	cwd, err := os.Getwd()
	if err != nil {
		return nil, fmt.Errorf("find bundle: %w", err)
	}
	args := []string{"-namespace", ns, "-id", id, "-address", containerdAddress}
	if debugLog {
		args = append(args, "-debug")
	}
	cmd := exec.Command(self, args...)
	cmd.Dir = cwd
	cmd.Env = append(os.Environ(), "GOMAXPROCS=2")
	// Its own process group, so signals meant for containerd miss it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd, nil
}

// groupOf returns the shim group of task id, from the annotations of its
// bundle's OCI spec:
//
//   - a pod's sandbox and containers share one shim, as with runc: the CRI
//     sandbox ID decides, and io.cocoon.group is ignored, so no annotation a
//     pod may carry (runtimes pass pod annotations through) can put its
//     container into another pod's shim;
//   - other tasks with io.cocoon.group share the shim of that group, in a
//     name space of its own ("group:" + name: IDs cannot hold a colon), so a
//     group can be neither a pod nor another task;
//   - any other task has a shim of its own.
func groupOf(id, specPath string) (string, error) {
	data, err := os.ReadFile(specPath)
	if err != nil {
		return "", fmt.Errorf("read bundle spec: %w", err)
	}
	var spec struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(data, &spec); err != nil {
		return "", fmt.Errorf("decode bundle spec %s: %w", specPath, err)
	}
	if sandbox := spec.Annotations[AnnotationSandboxID]; sandbox != "" {
		return sandbox, nil
	}
	if g := spec.Annotations[AnnotationGroup]; g != "" {
		return "group:" + g, nil
	}
	return id, nil
}

// Info describes the runtime and echoes the runtime options it was given.
func (m *Manager) Info(ctx context.Context, optionsR io.Reader) (*types.RuntimeInfo, error) {
	info := &types.RuntimeInfo{
		Name:    m.name,
		Version: &types.RuntimeVersion{Version: version(), Revision: revision()},
	}
	opts, err := shim.ReadRuntimeOptions[*runtimeoptions.Options](optionsR)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return info, nil
	case err != nil:
		return nil, fmt.Errorf("read runtime options (want %s): %w", "io.containerd.runtime.v1.Options", err)
	}
	if info.Options, err = typeurl.MarshalAnyToProto(opts); err != nil {
		return nil, fmt.Errorf("encode runtime options: %w", err)
	}
	return info, nil
}

func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

func revision() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return ""
}
