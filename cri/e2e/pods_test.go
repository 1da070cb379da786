package e2e

import (
	"context"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testimage"
)

// TestCocoonOrdinaryImage runs the busybox image (ordinary layers) with the
// cocoon handler: a VM restored from the base snapshot with the image as
// its root, logging the image's file, then reading a live volume.
func TestCocoonOrdinaryImage(t *testing.T) {
	n := startCocoonNode(t)
	ociImages(t)
	if err := n.stack.Import(context.Background(), images.busyboxTar, devstack.Snapshotter); err != nil {
		t.Fatal(err)
	}
	p := n.runPod(t, "cocoon-busybox", devstack.CocoonHandler, nil)
	dir, mount := liveVolumeDir(t, true)
	args := []string{"sh", "-c", "cat " + testimage.RandomFile + "; " + volumeReaderArgs[2]}
	cfg := n.ctrConfig(t, "app", busyboxRef, args, func(c *runtimeapi.ContainerConfig) {
		c.Linux.Resources = &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: cocoonMemoryLimit}
		mount(c)
	})
	ctr := n.crictl(t, "create", p.id, cfg, p.config)
	n.startCocoon(t, ctr)
	oneVM(t, p, ctr)
	n.waitLogs(t, ctr, strings.TrimSpace(images.busybox.RandomContent))
	n.checkAddress(t, ctr, p)
	n.checkLiveVolume(t, ctr, dir)
	n.crictl(t, "rmp", "-f", p.id)
	n.waitIdle(t, "the removed busybox pod")
}

// TestCocoonOneContainerAtATime: the pod's address goes to one VM at a
// time. An init-style container that ran and exited hands it on to the
// next; a second container running at once fails to start, saying why.
func TestCocoonOneContainerAtATime(t *testing.T) {
	n := startCocoonNode(t)
	p := n.runPod(t, "cocoon-seq", devstack.CocoonHandler, nil)
	initCfg := n.ctrConfig(t, "init", cocoonImage, []string{"sh", "-c", "ip addr; echo init done"}, func(c *runtimeapi.ContainerConfig) {
		c.Linux.Resources = &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: cocoonMemoryLimit}
	})
	first := n.crictl(t, "create", p.id, initCfg, p.config)
	n.crictl(t, "start", first)
	n.waitState(t, first, runtimeapi.ContainerState_CONTAINER_EXITED)
	n.waitLogs(t, first, "inet "+p.ip.String()+"/")

	app := n.createCocoon(t, p, "app", nil)
	n.startCocoon(t, app)
	n.checkAddress(t, app, p)

	// CRI creates the task, and so restores the VM, at StartContainer.
	second := n.createCocoon(t, p, "second", nil)
	out, err := n.crictlErr("start", second)
	if err == nil || !strings.Contains(out+err.Error(), "one app container at a time") {
		t.Fatalf("a second running container in the pod: %v\n%s\nwant an error saying a pod runs one app container at a time", err, out)
	}
	n.checkAddress(t, app, p)
	n.crictl(t, "rmp", "-f", p.id)
	n.waitIdle(t, "the removed pod")
}
