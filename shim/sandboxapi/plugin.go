package sandboxapi

import (
	"context"
	"fmt"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/plugins"
	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"
	"github.com/containerd/typeurl/v2"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
)

// pluginType is the sandbox service's plugin type. It cannot be
// plugins.TTRPCPlugin, which it requires (the task service): pkg/shim
// serves the TTRPC services of plugins of any type.
const pluginType plugin.Type = "io.cocoon.shim.sandbox.v1"

// Register makes the sandbox service a pkg/shim plugin serving TTRPC
// beside the task service (task.Register), whose pod VMs it serves. Call
// it before shim.RunShim.
func Register() {
	registry.Register(&plugin.Registration{
		Type:     pluginType,
		ID:       "sandbox",
		Requires: []plugin.Type{plugins.TTRPCPlugin},
		InitFn: func(ic *plugin.InitContext) (any, error) {
			ts, err := ic.GetByID(plugins.TTRPCPlugin, "task")
			if err != nil {
				return nil, err
			}
			svc, ok := ts.(*task.Service)
			if !ok {
				return nil, fmt.Errorf("the task plugin is %T, want *task.Service", ts)
			}
			ns, _ := namespaces.Namespace(ic.Context)
			return New(taskPods{svc}, storedOptions(ic.Properties[plugins.PropertyGRPCAddress], ns)), nil
		},
	})
}

// taskPods runs pod VMs in the task service.
type taskPods struct{ s *task.Service }

func (t taskPods) StartPod(ctx context.Context, r task.LaunchRequest) (Pod, error) {
	p, err := t.s.StartPod(ctx, r)
	if err != nil {
		return nil, err
	}
	return p, nil
}

func (t taskPods) StopPod(ctx context.Context, p Pod) error {
	return t.s.StopPod(ctx, p.(*task.PodVM))
}

func (t taskPods) RemovePod(ctx context.Context, p Pod) error {
	return t.s.RemovePod(ctx, p.(*task.PodVM))
}

func (t taskPods) ShutdownIfIdle() { t.s.ShutdownIfIdle() }

// storedOptions reads a sandbox's runtime options from containerd's
// sandbox store, where CRI put them (with the runtime handler's ConfigPath
// or config body) before it asked for the sandbox: CreateSandbox carries
// the pod's config, not the handler's.
func storedOptions(address, namespace string) OptionsFunc {
	return func(ctx context.Context, id string) (typeurl.Any, error) {
		if address == "" {
			return nil, fmt.Errorf("read the runtime options of sandbox %s: containerd's address is unknown", id)
		}
		client, err := containerd.New(address, containerd.WithDefaultNamespace(namespace))
		if err != nil {
			return nil, fmt.Errorf("connect to containerd at %s: %w", address, err)
		}
		defer client.Close()
		if _, ok := namespaces.Namespace(ctx); !ok {
			ctx = namespaces.WithNamespace(ctx, namespace)
		}
		sb, err := client.SandboxStore().Get(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("read the runtime options of sandbox %s from containerd: %w", id, err)
		}
		return sb.Runtime.Options, nil
	}
}
