// Package pause is the pause process a pod's VM runs for its sandbox:
// cocoon-pause, at Path in the guest's own root, so the VM mounts no pause
// image for a process that only waits. It exits 0 on
// SIGINT or SIGTERM, as the Kubernetes pause binary does, and reaps the
// children re-parented to it: it is the pod's PID 1 when the pod shares a
// PID namespace.
package pause

import (
	"os"
	"os/signal"

	"golang.org/x/sys/unix"
)

// Path is where the guest has cocoon-pause (guests built before it have
// the agent's binary there, which ran as the pause under that name).
const Path = "/sbin/cocoon-pause"

// WarmFlag, as the pause's one argument, has it exit 0 where it would
// wait: a pooled pod VM's warm-up runs it so (agent API 15), and the pod's
// pause then starts along code its guest has translated already.
const WarmFlag = "-warm"

// Main waits for SIGINT or SIGTERM, reaping exited children meanwhile,
// then exits 0.
func Main() {
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, unix.SIGINT, unix.SIGTERM, unix.SIGCHLD)
	if len(os.Args) == 2 && os.Args[1] == WarmFlag {
		os.Exit(0)
	}
	for sig := range sigs {
		if sig != unix.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every exited child; signals coalesce, so one SIGCHLD may
// stand for several exits.
func reap() {
	for {
		var ws unix.WaitStatus
		if pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil); pid <= 0 || err != nil {
			return
		}
	}
}
