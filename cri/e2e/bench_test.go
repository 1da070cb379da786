package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/pelletier/go-toml/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
)

// podVMHandler is the bench node's cocoon handler with one VM per pod
// under containerd's default sandboxer (a pause container, whose task
// restores the VM), beside the cocoon handler's one VM per container and
// sandboxAPIHandler's VM per pod under containerd's sandbox API;
// coldPodVMHandler is podVMHandler with shim.warm_runc off, and
// runcPodVMHandler with shim.own_init off (the guest's runc makes the
// containers, and is warmed).
const (
	podVMHandler     = "cocoon-pod"
	coldPodVMHandler = "cocoon-pod-cold"
	runcPodVMHandler = "cocoon-pod-runc"
)

// benchArgs is every bench container's command.
var benchArgs = []string{"sleep", "3600"}

// kubeletGap stands for what kubelet does between a pod's RunPodSandbox
// and its first CreateContainer (the image check, the container's
// volumes and config), which containerd's and crictl's callers do not.
const kubeletGap = 300 * time.Millisecond

// pullGap stands for an image pull between a pod's RunPodSandbox and its
// first CreateContainer, as when the node does not have the image yet.
const pullGap = 1500 * time.Millisecond

// BenchmarkPodStart times, through containerd's CRI (its gRPC API, no
// crictl process on the clock), RunPodSandbox → CreateContainer →
// StartContainer of a one-container pod of the busybox image, with runc,
// with cocoon's one VM per container and with one VM per pod (both
// sandboxers; without the warm-up; with the guest's runc rather than its
// own container init), side by side in one containerd; the first container's create →
// start with kubeletGap, and with pullGap, after RunPodSandbox, in the
// three pod-VM ways; and a second container's create → start in a running
// pod's VM (join), against which the goal is ≤ 0.3× of a restore:
//
//	go test -run '^$' -bench BenchmarkPodStart -benchtime 5x ./cri/e2e/
func BenchmarkPodStart(b *testing.B) {
	dir := b.TempDir()
	podCfg, coldCfg, runcCfg := filepath.Join(dir, "pod-vm.toml"), filepath.Join(dir, "pod-vm-cold.toml"), filepath.Join(dir, "pod-vm-runc.toml")
	pooledCfg, pooledPodCfg := filepath.Join(dir, "pooled.toml"), filepath.Join(dir, "pooled-pod-vm.toml")
	n := startChainNode(b, nodeOptions{cocoonConfig: cocoonConfig, handlers: []devstack.Handler{
		podVMBenchHandler(podVMHandler, podCfg, ""),
		podVMBenchHandler(coldPodVMHandler, coldCfg, ""),
		podVMBenchHandler(runcPodVMHandler, runcCfg, ""),
		podVMBenchHandler(sandboxAPIHandler, podCfg, devstack.SandboxerShim),
		podVMBenchHandler(pooledHandler, pooledCfg, ""),
		podVMBenchHandler(pooledPodVMHandler, pooledPodCfg, ""),
		podVMBenchHandler(pooledSandboxAPIHandler, pooledPodCfg, devstack.SandboxerShim),
	}})
	writePodVMConfig(b, n.stack.ConfigPath, podCfg, func(s *config.Shim) { s.WarmRunc, s.OwnInit = true, true })
	writePodVMConfig(b, n.stack.ConfigPath, coldCfg, func(s *config.Shim) { s.WarmRunc, s.OwnInit = false, true })
	writePodVMConfig(b, n.stack.ConfigPath, runcCfg, func(s *config.Shim) { s.WarmRunc, s.OwnInit = true, false })
	writePooledConfigs(b, n.stack.ConfigPath, pooledCfg, pooledPodCfg)
	ctx := context.Background()
	if err := n.stack.Import(ctx, images.busyboxTar, devstack.Snapshotter); err != nil {
		b.Fatal(err)
	}
	rt := criClient(b, n.stack.Address)
	// A container-mode VM must hold the guest; a pod-mode container's limit
	// must fit in it.
	limits := map[string]int64{devstack.CocoonHandler: cocoonMemoryLimit}
	pods := []string{podVMHandler, coldPodVMHandler, runcPodVMHandler}
	for _, handler := range append([]string{devstack.RuncHandler, devstack.CocoonHandler, sandboxAPIHandler}, pods...) {
		b.Run("pod/handler="+handler, func(b *testing.B) { benchPods(b, n, rt, handler, limits[handler], 0) })
	}
	for _, handler := range pods {
		b.Run("first/handler="+handler, func(b *testing.B) { benchPods(b, n, rt, handler, 0, kubeletGap) })
		b.Run("pulled/handler="+handler, func(b *testing.B) { benchPods(b, n, rt, handler, 0, pullGap) })
	}
	for _, handler := range pods {
		b.Run("join/handler="+handler, func(b *testing.B) { benchJoins(b, n, rt, handler) })
	}
	for _, handler := range []string{pooledHandler, pooledPodVMHandler, pooledSandboxAPIHandler} {
		primed := false
		b.Run("pooled/handler="+handler, func(b *testing.B) { benchPooledPods(b, n, rt, handler, limits[devstack.CocoonHandler], &primed) })
	}
}

// benchJoins times b.N second containers' create → start, one after
// another, in a running pod of handler.
func benchJoins(b *testing.B, n *node, rt runtimeapi.RuntimeServiceClient, handler string) {
	ctx := context.Background()
	b.StopTimer()
	pod := n.startPod(b, rt, "join", handler, 0, 0)
	defer n.removePod(b, rt, pod)
	for i := range b.N {
		name := "second-" + strconv.Itoa(i)
		b.StartTimer()
		id := startContainer(b, rt, pod, containerConfig(name, busyboxRef, benchArgs, withKubeletNamespaces))
		b.StopTimer()
		if _, err := rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
			b.Fatalf("remove %s: %v", name, err)
		}
	}
}

// podVMBenchHandler is a cocoon handler with the config at path.
func podVMBenchHandler(name, path, sandboxer string) devstack.Handler {
	return devstack.Handler{Name: name, RuntimeType: devstack.Runtime, Snapshotter: devstack.Snapshotter,
		Sandboxer: sandboxer, Options: map[string]any{"ConfigPath": path}}
}

// benchPods starts b.N one-container pods with handler and reports
// RunPodSandbox's and the container's create → start medians. With gap,
// only create → start is timed, gap after RunPodSandbox.
func benchPods(b *testing.B, n *node, rt runtimeapi.RuntimeServiceClient, handler string, limit int64, gap time.Duration) {
	var runp, start time.Duration
	for i := range b.N {
		if gap > 0 {
			b.StopTimer()
		}
		pod := n.startPod(b, rt, handler+"-"+strconv.Itoa(i), handler, limit, gap)
		b.StopTimer()
		runp, start = runp+pod.runp, start+pod.start
		n.removePod(b, rt, pod)
		b.StartTimer()
	}
	if gap == 0 {
		reportMs(b, "runp-ms/op", runp)
	}
	reportMs(b, "start-ms/op", start)
}

// writePodVMConfig writes the node's cocoon config at base with one VM per
// pod, and its shim settings edited, to path.
func writePodVMConfig(b *testing.B, base, path string, edit func(*config.Shim)) {
	writeShimConfig(b, base, path, func(s *config.Shim) {
		s.PodVM = config.PodVMPod
		edit(s)
	})
}

// writeShimConfig writes the node's cocoon config at base with its shim
// settings edited to path.
func writeShimConfig(b *testing.B, base, path string, edit func(*config.Shim)) {
	data, err := os.ReadFile(base)
	if err != nil {
		b.Fatal(err)
	}
	cfg, err := config.Parse(data)
	if err != nil {
		b.Fatalf("the node's cocoon config: %v", err)
	}
	edit(&cfg.Shim)
	if data, err = toml.Marshal(cfg); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		b.Fatal(err)
	}
}

// criClient dials containerd's CRI at its gRPC socket.
func criClient(tb testing.TB, address string) runtimeapi.RuntimeServiceClient {
	conn, err := grpc.NewClient("unix://"+address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatalf("dial containerd's CRI: %v", err)
	}
	tb.Cleanup(func() { conn.Close() })
	return runtimeapi.NewRuntimeServiceClient(conn)
}

// reportMs reports total over b.N as milliseconds per op under unit.
func reportMs(b *testing.B, unit string, total time.Duration) {
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), unit)
}

// benchPod is a pod the bench runs: its ID and config, and how long
// RunPodSandbox and its container's create → start took.
type benchPod struct {
	id          string
	config      *runtimeapi.PodSandboxConfig
	runp, start time.Duration
}

// startPod runs a pod with handler and one busybox container in it, with
// memory limit (none when 0), started gap after the pod.
func (n *node) startPod(b *testing.B, rt runtimeapi.RuntimeServiceClient, name, handler string, limit int64, gap time.Duration) benchPod {
	cfg := n.podSandboxConfig(name, nil)
	cfg.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{NamespaceOptions: kubeletNamespaces()}
	began := time.Now()
	resp, err := rt.RunPodSandbox(context.Background(), &runtimeapi.RunPodSandboxRequest{Config: cfg, RuntimeHandler: handler})
	if err != nil {
		b.Fatalf("run pod %s with %s: %v", name, handler, err)
	}
	pod := benchPod{id: resp.PodSandboxId, config: cfg, runp: time.Since(began)}
	time.Sleep(gap)
	if gap > 0 {
		b.StartTimer()
	}
	began = time.Now()
	startContainer(b, rt, pod, containerConfig("app", busyboxRef, benchArgs, func(c *runtimeapi.ContainerConfig) {
		withKubeletNamespaces(c)
		if limit > 0 {
			c.Linux.Resources = &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: limit}
		}
	}))
	pod.start = time.Since(began)
	return pod
}

// kubeletNamespaces are the namespace options kubelet gives a pod and its
// containers unless the pod shares its process namespace: a PID namespace
// per container. Left unset, CRI's default is the pod's (NamespaceMode 0).
func kubeletNamespaces() *runtimeapi.NamespaceOption {
	return &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_POD, Pid: runtimeapi.NamespaceMode_CONTAINER, Ipc: runtimeapi.NamespaceMode_POD}
}

// withKubeletNamespaces gives c kubelet's namespace options.
func withKubeletNamespaces(c *runtimeapi.ContainerConfig) {
	c.Linux.SecurityContext = &runtimeapi.LinuxContainerSecurityContext{NamespaceOptions: kubeletNamespaces()}
}

// startContainer creates and starts c in pod and returns its ID.
func startContainer(b *testing.B, rt runtimeapi.RuntimeServiceClient, pod benchPod, c *runtimeapi.ContainerConfig) string {
	ctx := context.Background()
	created, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod.id, Config: c, SandboxConfig: pod.config})
	if err != nil {
		b.Fatalf("create %s: %v", c.Metadata.Name, err)
	}
	if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: created.ContainerId}); err != nil {
		b.Fatalf("start %s: %v", c.Metadata.Name, err)
	}
	return created.ContainerId
}

// removePod stops and removes pod, and waits until nothing of it is left.
func (n *node) removePod(b *testing.B, rt runtimeapi.RuntimeServiceClient, pod benchPod) {
	n.stopAndRemovePod(b, rt, pod)
	n.waitIdle(b, "the bench's pod")
}

// stopAndRemovePod stops and removes pod.
func (n *node) stopAndRemovePod(b *testing.B, rt runtimeapi.RuntimeServiceClient, pod benchPod) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod.id}); err != nil {
		b.Fatalf("stop pod %s: %v", pod.id, err)
	}
	if _, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod.id}); err != nil {
		b.Fatalf("remove pod %s: %v", pod.id, err)
	}
}
