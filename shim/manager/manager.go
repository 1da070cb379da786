// Package manager is the shim server binary's lifecycle half (containerd
// pkg/shim's Shim interface): `start` starts the long-running task server
// and returns its socket (as the launcher binary does, through package
// launch), `delete` cleans up after a task whose server is gone, and `-info`
// describes the runtime.
package manager

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"

	bootapi "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	"github.com/containerd/containerd/api/types"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/launch"
)

// Name is the runtime name containerd knows this shim by.
const Name = "io.containerd.cocoon.v2"

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

// Start starts the task server for params.InstanceID, or returns the
// address of the server already running for the task's group (package
// launch, which the launcher binary runs too). This binary is the server.
func (m *Manager) Start(ctx context.Context, params *bootapi.BootstrapParams) (*bootapi.BootstrapResult, error) {
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find shim binary: %w", err)
	}
	addr, err := launch.Start(launch.Request{
		ID:         params.GetInstanceID(),
		Namespace:  ns,
		Containerd: params.GetContainerdGrpcAddress(),
		SocketDir:  params.GetSocketDir(),
		Debug:      params.GetLogLevel() <= bootapi.LogLevel_LOG_LEVEL_DEBUG,
		Server:     self,
	})
	if err != nil {
		return nil, err
	}
	return &bootapi.BootstrapResult{Version: 3, Protocol: "ttrpc", Address: addr}, nil
}

// Info describes the runtime, with its features, and echoes the runtime
// options it was given.
func (m *Manager) Info(ctx context.Context, optionsR io.Reader) (*types.RuntimeInfo, error) {
	info := &types.RuntimeInfo{
		Name:    m.name,
		Version: &types.RuntimeVersion{Version: version(), Revision: revision()},
	}
	feat, err := typeurl.MarshalAnyToProto(runtimeFeatures())
	if err != nil {
		return nil, fmt.Errorf("encode runtime features: %w", err)
	}
	info.Features = feat
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
