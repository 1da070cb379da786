package e2e

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
)

// restrictedSecurity is Kubernetes' "restricted" profile: what confinement
// a container start applies beyond CRI's default (default capabilities,
// no seccomp filter, masked and read-only paths in both).
func restrictedSecurity(c *runtimeapi.ContainerConfig) {
	c.Linux.SecurityContext = &runtimeapi.LinuxContainerSecurityContext{
		Capabilities:   &runtimeapi.Capability{DropCapabilities: []string{"ALL"}},
		NoNewPrivs:     true,
		Seccomp:        &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_RuntimeDefault},
		ReadonlyRootfs: true,
		RunAsUser:      &runtimeapi.Int64Value{Value: 1000},
	}
}

// BenchmarkConfinement times CreateContainer → StartContainer of a busybox
// container in a running pod with CRI's default security context and with
// the restricted profile, the two in turns, for runc and for a pod's VM
// (where the guest's runc applies it): what confinement costs a start,
// before and after in one run, as medians and their ratio.
//
//	go test -run '^$' -bench BenchmarkConfinement -benchtime 10x ./cri/e2e/
func BenchmarkConfinement(b *testing.B) {
	n, rt := startPodVMBenchNode(b)
	ctx := context.Background()
	for _, handler := range []string{devstack.RuncHandler, devstack.CocoonHandler} {
		b.Run("handler="+handler, func(b *testing.B) {
			b.StopTimer()
			pod := n.startPod(b, rt, "confinement-"+handler, handler, 0, 0)
			defer n.removePod(b, rt, pod)
			took := map[bool][]time.Duration{}
			for i := range b.N {
				for _, restricted := range []bool{i%2 == 0, i%2 != 0} {
					var edit func(*runtimeapi.ContainerConfig)
					if restricted {
						edit = restrictedSecurity
					}
					name := "c-" + strconv.Itoa(i) + "-" + strconv.FormatBool(restricted)
					began := time.Now()
					id := startContainer(b, rt, pod, containerConfig(name, busyboxRef, benchArgs, edit))
					took[restricted] = append(took[restricted], time.Since(began))
					if _, err := rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id}); err != nil {
						b.Fatalf("stop %s: %v", name, err)
					}
					if _, err := rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
						b.Fatalf("remove %s: %v", name, err)
					}
				}
			}
			def, res := median(took[false]), median(took[true])
			b.ReportMetric(float64(def.Microseconds())/1000, "default-ms")
			b.ReportMetric(float64(res.Microseconds())/1000, "restricted-ms")
			b.ReportMetric(float64(res)/float64(def), "restricted/default")
		})
	}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// startPodVMBenchNode starts a node whose cocoon handler runs one VM per
// pod, with the busybox image, and dials its CRI.
func startPodVMBenchNode(b *testing.B) (*node, runtimeapi.RuntimeServiceClient) {
	n := startChainNode(b, nodeOptions{cocoonConfig: podVMConfig})
	if err := n.stack.Import(context.Background(), images.busyboxTar, devstack.Snapshotter); err != nil {
		b.Fatal(err)
	}
	return n, criClient(b, n.stack.Address)
}
