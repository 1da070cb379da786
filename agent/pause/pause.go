// Package pause is the pause process a pod's VM runs for its sandbox: the
// agent's own binary executed under Path, in the guest's own root, so the
// VM mounts no pause image for a process that only waits. It exits 0 on
// SIGINT or SIGTERM, as the Kubernetes pause binary does, and reaps the
// children re-parented to it: it is the pod's PID 1 when the pod shares a
// PID namespace.
package pause

import (
	"os"
	"os/signal"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Path is where the guest has the agent's binary under the pause's name;
// the agent's main checks for it (IsPause) before anything else.
const Path = "/sbin/cocoon-pause"

// IsPause says whether argv0 is the pause's.
func IsPause(argv0 string) bool { return filepath.Base(argv0) == filepath.Base(Path) }

// Main waits for SIGINT or SIGTERM, reaping exited children meanwhile,
// then exits 0.
func Main() {
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
