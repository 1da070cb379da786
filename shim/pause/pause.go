// Package pause runs a pod sandbox task without a VM. CRI's sandbox
// container exists only to hold the pod's network namespace and cgroup;
// restoring a VM for it would double the cost of every pod. A small host
// process — this shim's own binary, re-executed as Argv0 — holds them
// instead and answers signals as the pause image's process does.
package pause

import (
	"os"
	"os/signal"

	"golang.org/x/sys/unix"
)

// Argv0 is the name the shim binary is re-executed under to be a sandbox's
// pause process; main checks for it before anything else.
const Argv0 = "cocoon-pause"

// readyFD is the pipe the pause process closes once its signal handlers
// are in place, so no SIGTERM can reach it before it would exit 0.
const readyFD = 3

// Main is the pause process: it sleeps until SIGTERM or SIGINT, then exits
// 0, as the Kubernetes pause binary does.
func Main() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT)
	unix.Close(readyFD)
	<-sigs
	os.Exit(0)
}
