package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// pod is a pod sandbox crictl ran.
type pod struct {
	name, id, config string
	ip               net.IP
}

// podEdit changes a pod sandbox config before it is written.
type podEdit func(*runtimeapi.PodSandboxConfig)

// privilegedPod makes a pod whose containers may be privileged.
func privilegedPod(c *runtimeapi.PodSandboxConfig) {
	c.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{Privileged: true}
}

// podConfig writes a pod sandbox config for crictl and returns its path:
// the pod lives in the node's cgroup parent and logs under its pod log dir.
func (n *node) podConfig(t *testing.T, name string, annotations map[string]string, edits ...podEdit) string {
	t.Helper()
	c := n.podSandboxConfig(name, annotations)
	for _, edit := range edits {
		edit(c)
	}
	return n.writeJSON(t, name+"-pod.json", c)
}

// podSandboxConfig is the config podConfig writes.
func (n *node) podSandboxConfig(name string, annotations map[string]string) *runtimeapi.PodSandboxConfig {
	return &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "cri-e2e", Uid: name + "-uid"},
		Hostname:     name,
		LogDirectory: filepath.Join(n.stack.PodLogDir, name),
		Annotations:  annotations,
		Linux:        &runtimeapi.LinuxPodSandboxConfig{CgroupParent: n.stack.CgroupParent},
	}
}

// ctrConfig writes a container config running image with args and returns
// its path; edit, if given, changes it first.
func (n *node) ctrConfig(t *testing.T, name, image string, args []string, edit func(*runtimeapi.ContainerConfig)) string {
	t.Helper()
	return n.writeJSON(t, name+"-ctr.json", containerConfig(name, image, args, edit))
}

// containerConfig is the config ctrConfig writes.
func containerConfig(name, image string, args []string, edit func(*runtimeapi.ContainerConfig)) *runtimeapi.ContainerConfig {
	c := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Image:    &runtimeapi.ImageSpec{Image: image},
		Command:  args,
		LogPath:  name + ".log",
		Linux:    &runtimeapi.LinuxContainerConfig{},
	}
	if edit != nil {
		edit(c)
	}
	return c
}

// writeJSON writes v into the node's config dir (which outlives subtests).
func (n *node) writeJSON(t *testing.T, name string, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(n.configs, name)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// runPod runs a pod with handler and checks it is ready, from the pause
// image, with an address in the node's subnet.
func (n *node) runPod(t *testing.T, name, handler string, annotations map[string]string, edits ...podEdit) *pod {
	t.Helper()
	p := &pod{name: name, config: n.podConfig(t, name, annotations, edits...)}
	p.id = n.crictl(t, "runp", "--runtime", handler, p.config)
	st := n.inspectPod(t, p.id)
	if st.Status.State != runtimeapi.PodSandboxState_SANDBOX_READY.String() || st.Info.Image != pauseRef {
		t.Fatalf("pod %s is %s from image %q, want SANDBOX_READY from %s", name, st.Status.State, st.Info.Image, pauseRef)
	}
	if p.ip = net.ParseIP(st.Status.Network.IP); p.ip == nil || !n.net.Subnet.Contains(p.ip) {
		t.Fatalf("pod %s has address %q, want one in the CNI network %s", name, st.Status.Network.IP, n.net.Subnet)
	}
	return p
}

// podStatus is what crictl inspectp -o json says of a pod.
type podStatus struct {
	Status struct {
		State   string `json:"state"`
		Network struct {
			IP string `json:"ip"`
		} `json:"network"`
	} `json:"status"`
	Info struct {
		Image string `json:"image"`
	} `json:"info"`
}

func (n *node) inspectPod(t *testing.T, id string) podStatus {
	t.Helper()
	var st podStatus
	decode(t, n.crictl(t, "inspectp", "-o", "json", id), &st)
	return st
}

// ctrStatus is what crictl inspect -o json says of a container.
type ctrStatus struct {
	Status struct {
		State    string `json:"state"`
		ExitCode int32  `json:"exitCode"`
	} `json:"status"`
	Info struct {
		Pid         int `json:"pid"`
		RuntimeSpec struct {
			Linux struct {
				CgroupsPath string `json:"cgroupsPath"`
			} `json:"linux"`
		} `json:"runtimeSpec"`
	} `json:"info"`
}

func (n *node) inspect(t *testing.T, id string) ctrStatus {
	t.Helper()
	var st ctrStatus
	decode(t, n.crictl(t, "inspect", "-o", "json", id), &st)
	return st
}

// waitState waits until container id is in state (a runtimeapi.ContainerState name).
func (n *node) waitState(t *testing.T, id string, state runtimeapi.ContainerState) ctrStatus {
	t.Helper()
	var st ctrStatus
	eventually(t, "container "+id+" state", func() error {
		if st = n.inspect(t, id); st.Status.State != state.String() {
			return fmt.Errorf("%s, want %s", st.Status.State, state)
		}
		return nil
	})
	return st
}

// waitLogs waits until crictl logs of id holds want.
func (n *node) waitLogs(t *testing.T, id, want string) {
	t.Helper()
	eventually(t, "crictl logs "+id, func() error {
		out, err := n.crictlErr("logs", id)
		if err != nil {
			return err
		}
		if !strings.Contains(out, want) {
			return fmt.Errorf("logs %q lack %q", out, want)
		}
		return nil
	})
}

// checkAddress checks that `ip addr` in container id shows the pod's address.
func (n *node) checkAddress(t *testing.T, id string, p *pod) {
	t.Helper()
	out := n.crictl(t, "exec", "-s", id, "ip", "addr")
	if !strings.Contains(out, "inet "+p.ip.String()+"/") {
		t.Fatalf("ip addr in the container:\n%s\nwant the pod address %s", out, p.ip)
	}
}

// usage is the CPU and memory figures in crictl's stats.
type usage struct {
	CPU struct {
		UsageCoreNanoSeconds struct {
			Value string `json:"value"`
		} `json:"usageCoreNanoSeconds"`
	} `json:"cpu"`
	Memory struct {
		WorkingSetBytes struct {
			Value string `json:"value"`
		} `json:"workingSetBytes"`
	} `json:"memory"`
}

// check says what is missing from u, the stats of what.
func (u usage) check(what string) error {
	cpu, _ := strconv.ParseUint(u.CPU.UsageCoreNanoSeconds.Value, 10, 64)
	mem, _ := strconv.ParseUint(u.Memory.WorkingSetBytes.Value, 10, 64)
	if cpu == 0 || mem == 0 {
		return fmt.Errorf("stats of %s: cpu %q ns, memory %q bytes; want both non-zero", what, u.CPU.UsageCoreNanoSeconds.Value, u.Memory.WorkingSetBytes.Value)
	}
	return nil
}

// ctrUsage is one container's stats.
type ctrUsage struct {
	Attributes struct {
		ID string `json:"id"`
	} `json:"attributes"`
	usage
}

// checkStats checks crictl stats of container id: its own, non-zero.
func (n *node) checkStats(t *testing.T, id string) {
	t.Helper()
	var out struct {
		Stats []ctrUsage `json:"stats"`
	}
	decode(t, n.crictl(t, "stats", "-o", "json", id), &out)
	if len(out.Stats) != 1 || out.Stats[0].Attributes.ID != id {
		t.Fatalf("crictl stats %s: %+v, want that container's stats", id, out.Stats)
	}
	if err := out.Stats[0].check("container " + id); err != nil {
		t.Fatal(err)
	}
}

// checkPodStats checks crictl statsp of pod p: the pod's own figures
// (CPU and memory of its cgroup) and its containers' figures.
func (n *node) checkPodStats(t *testing.T, p *pod, ctrs ...string) {
	t.Helper()
	var out struct {
		Stats []struct {
			Attributes struct {
				ID string `json:"id"`
			} `json:"attributes"`
			Linux struct {
				usage
				Containers []ctrUsage `json:"containers"`
			} `json:"linux"`
		} `json:"stats"`
	}
	decode(t, n.crictl(t, "statsp", "-o", "json", p.id), &out)
	if len(out.Stats) != 1 || out.Stats[0].Attributes.ID != p.id {
		t.Fatalf("crictl statsp %s: %+v, want the pod's stats", p.id, out.Stats)
	}
	linux := out.Stats[0].Linux
	if err := linux.check("pod " + p.name); err != nil {
		t.Fatal(err)
	}
	for _, id := range ctrs {
		i := slices.IndexFunc(linux.Containers, func(u ctrUsage) bool { return u.Attributes.ID == id })
		if i < 0 {
			t.Fatalf("crictl statsp %s lists no stats for container %s", p.id, id)
		}
		if err := linux.Containers[i].check("container " + id); err != nil {
			t.Fatal(err)
		}
	}
}

func decode(t *testing.T, data string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(data), v); err != nil {
		t.Fatalf("decode crictl output: %v:\n%s", err, data)
	}
}
