// Command containerd-shim-cocoon-v2 is cocoon's containerd runtime shim
// (runtime io.containerd.cocoon.v2): every task is a microVM restored from a
// snapshot chain.
package main

import (
	"context"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/v2/pkg/shim"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/manager"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/pause"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/vm"
)

func main() {
	if filepath.Base(os.Args[0]) == pause.Argv0 {
		pause.Main()
		return
	}
	task.Register(task.PodLauncher{VM: &vm.Launcher{}, Sandbox: pause.Launcher{}})
	// The hypervisor is the shim's direct child and the drivers reap it with
	// exec.Cmd.Wait. pkg/shim's default reaper would steal that exit status,
	// and a subreaper would collect orphans nobody reaps, so both are off.
	shim.RunShim(context.Background(), manager.New(manager.Name), func(c *shim.Config) {
		c.NoReaper = true
		c.NoSubreaper = true
	})
}
