package network

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// ErrHostNamespace is wrapped by RefuseHost's error.
var ErrHostNamespace = errors.New("a VM runtime cannot take over the host's network namespace: its interface would be redirected into the VM, cutting the host off; give the task a network namespace of its own, or none (ctr run --net-host) for a VM without network")

// hostNamespaces name the network namespaces no VM may take over: init's
// and the process's own, the host's.
var hostNamespaces = []string{"/proc/1/ns/net", "/proc/self/ns/net"}

// RefuseHost fails when n is this process's own network namespace or
// init's. A VM takes over its namespace's interface (Connect redirects
// all of its traffic to the tap), which a namespace of the host's must
// keep.
func (n *Namespace) RefuseHost() error {
	var st unix.Stat_t
	if err := unix.Fstat(int(n.f.Fd()), &st); err != nil {
		return fmt.Errorf("stat network namespace %s: %w", n.path, err)
	}
	for _, p := range hostNamespaces {
		var host unix.Stat_t
		err := unix.Stat(p, &host)
		if errors.Is(err, unix.EACCES) {
			// init's namespaces can be closed even to root (a sandbox's
			// pid 1); a namespace that cannot be looked at cannot be
			// opened by that path either.
			continue
		}
		if err != nil {
			return fmt.Errorf("stat host network namespace %s: %w", p, err)
		}
		if st.Dev == host.Dev && st.Ino == host.Ino {
			return fmt.Errorf("network namespace %s is %s: %w", n.path, p, ErrHostNamespace)
		}
	}
	return nil
}
