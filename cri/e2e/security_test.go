package e2e

import (
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// restrictedArgs print what the kernel says of the process's confinement,
// try to write to the root and name every process the container sees.
var restrictedArgs = []string{"sh", "-c", "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; " +
	"touch /written 2>/dev/null && echo root-writable || echo root-read-only; " +
	"echo seen: $(cat /proc/[0-9]*/comm)"}

// restrictedSeen are the only processes a restricted container may see:
// its shell, the shell's subshell and cat.
var restrictedSeen = map[string]bool{"sh": true, "cat": true}

// bridgeArgs make a bridge, which takes CAP_NET_ADMIN in the pod's network
// namespace (under cocoon, the pod's VM's), and remove it.
var bridgeArgs = []string{"sh", "-c", "ip link add cocoon-br0 type bridge && ip link del cocoon-br0 && echo bridge-made"}

// restricted runs a container with Kubernetes' "restricted" profile (drop
// ALL, no_new_privs, RuntimeDefault seccomp, read-only root, non-root):
// the kernel reports no effective capability, no_new_privs and a seccomp
// filter, the root refuses writes, and no process outside the container is
// in sight (under cocoon, not the guest's agent), so none can be signalled.
func (w *podWorkload) restricted(t *testing.T) {
	ctr := w.n.startBusybox(t, w.p, "restricted", restrictedArgs, func(c *runtimeapi.ContainerConfig) {
		restrictedSecurity(c)
		// Its own PID namespace: the workload's pod shares one.
		c.Linux.SecurityContext.NamespaceOptions = &runtimeapi.NamespaceOption{Pid: runtimeapi.NamespaceMode_CONTAINER}
	})
	if st := w.n.waitState(t, ctr, runtimeapi.ContainerState_CONTAINER_EXITED); st.Status.ExitCode != 0 {
		t.Fatalf("the restricted container exited with %d, want 0", st.Status.ExitCode)
	}
	logs := w.n.crictl(t, "logs", ctr)
	for _, want := range []string{"CapEff:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2", "root-read-only"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the restricted container's output lacks %q:\n%s", want, logs)
		}
	}
	_, seen, ok := strings.Cut(logs, "seen:")
	if !ok {
		t.Fatalf("the restricted container named no process:\n%s", logs)
	}
	for _, comm := range strings.Fields(seen) {
		if !restrictedSeen[comm] {
			t.Errorf("the restricted container sees process %q, which is not its own:\n%s", comm, logs)
		}
	}
	w.n.crictl(t, "rm", ctr)
}

// privileged runs a privileged container, in a privileged pod of its own,
// that makes a bridge.
func (w *podWorkload) privileged(t *testing.T) {
	p := w.startPod(t, "privileged", privilegedPod)
	defer w.n.crictl(t, "rmp", "-f", p.id)
	ctr := w.n.startBusybox(t, p, "bridge", bridgeArgs, func(c *runtimeapi.ContainerConfig) {
		c.Linux.SecurityContext = &runtimeapi.LinuxContainerSecurityContext{Privileged: true}
	})
	if st := w.n.waitState(t, ctr, runtimeapi.ContainerState_CONTAINER_EXITED); st.Status.ExitCode != 0 {
		logs, _ := w.n.crictlErr("logs", ctr)
		t.Fatalf("the privileged container exited with %d, want 0 (its logs: %q)", st.Status.ExitCode, logs)
	}
	w.n.waitLogs(t, ctr, "bridge-made")
}
