// Package hold is a pod sandbox's pause process: it holds the pod's network
// namespace and cgroup and answers signals as the pause image's process
// does. It runs in the shim's launcher binary, whose start-up and memory
// are a few of the task server's, so it imports next to nothing.
package hold

import (
	"os"
	"os/signal"

	"golang.org/x/sys/unix"
)

// Argv0 is the name the launcher binary is executed under to be a
// sandbox's pause process; its main checks for it before anything else.
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
