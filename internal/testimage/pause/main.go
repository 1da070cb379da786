// Command pause is the test pause image's process: it holds a pod's
// namespaces, reaps the children re-parented to it (it is the pod's PID 1
// when the pod shares a PID namespace) and exits 0 on SIGINT or SIGTERM.
// Built static (CGO_ENABLED=0) by testimage.Pause.
package main

import (
	"os"
	"os/signal"

	"golang.org/x/sys/unix"
)

func main() {
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, unix.SIGINT, unix.SIGTERM, unix.SIGCHLD)
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
