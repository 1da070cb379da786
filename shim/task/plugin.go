package task

import (
	"runtime/debug"

	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/containerd/v2/plugins"
	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"
)

// gcPercent replaces the GOGC 40 pkg/shim sets, which keeps many small
// runc shims lean: a cocoon shim's heap is a few MiB beside its VM's
// hundreds, and at 40 a collection fell on every task's start.
const gcPercent = 100

// Register makes the task service a pkg/shim TTRPC plugin that restores
// VMs with l. Call it before shim.RunShim.
func Register(l Launcher) {
	registry.Register(&plugin.Registration{
		Type:     plugins.TTRPCPlugin,
		ID:       "task",
		Requires: []plugin.Type{plugins.EventPlugin, plugins.InternalPlugin},
		InitFn: func(ic *plugin.InitContext) (any, error) {
			debug.SetGCPercent(gcPercent)
			pp, err := ic.GetByID(plugins.EventPlugin, "publisher")
			if err != nil {
				return nil, err
			}
			ss, err := ic.GetByID(plugins.InternalPlugin, "shutdown")
			if err != nil {
				return nil, err
			}
			s := NewService(ic.Context, l, pp.(shim.Publisher), ss.(shutdown.Service))
			s.containerd = ic.Properties[plugins.PropertyGRPCAddress]
			return s, nil
		},
	})
}
