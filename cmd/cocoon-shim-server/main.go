// Command cocoon-shim-server is cocoon's task server (containerd pkg/shim's
// long-running half; runtime io.containerd.cocoon.v2): every task is a
// microVM restored from a snapshot chain. containerd runs the small
// launcher containerd-shim-cocoon-v2, which starts this binary, hands
// tasks to a spare of it, or runs it for everything but `start`.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/v2/pkg/shim"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/launch"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/manager"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/pause"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/sandboxapi"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/share"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/spare"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/vm"
)

func main() {
	if filepath.Base(os.Args[0]) == share.Argv0 {
		share.Main()
		return
	}
	// A spare waits, then goes on as the task server it was handed; one
	// that gets no task exits (silently: it has no log before a task).
	launcher := &vm.Launcher{}
	if len(os.Args) == 3 && os.Args[1] == spare.Flag {
		task.WarmCodecs()
		if err := spare.Wait(os.Args[2], launcher.FillPool); err != nil {
			launcher.ClosePool()
			os.Exit(1)
		}
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "find the shim binary: %v\n", err)
		os.Exit(1)
	}
	// The pause process is the launcher binary: a few of this one's
	// start-up and memory for each pod.
	sandbox := pause.Launcher{Binary: filepath.Join(filepath.Dir(self), launch.LauncherName)}
	task.Register(newRefilling(task.PodLauncher{VM: launcher, Sandbox: sandbox}, launcher))
	// containerd's sandbox API (a CRI handler's sandboxer = "shim") on the
	// same connection: the pod's VM, which its containers' tasks join.
	sandboxapi.Register()
	registerSocketUnlink()
	// The hypervisor is the shim's direct child and the drivers reap it with
	// exec.Cmd.Wait. pkg/shim's default reaper would steal that exit status,
	// and a subreaper would collect orphans nobody reaps, so both are off.
	shim.RunShim(context.Background(), manager.New(manager.Name), func(c *shim.Config) {
		c.NoReaper = true
		c.NoSubreaper = true
	})
}
