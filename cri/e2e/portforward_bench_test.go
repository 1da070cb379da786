package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// bigPage is the size of the page the throughput bench fetches.
const bigPage = 8 << 20

// webBenchArgs serves a small page (/) and bigPage bytes (/big) on 8080.
var webBenchArgs = []string{"sh", "-c", "mkdir -p /www && echo " + podPage + " > /www/index.html && " +
	"dd if=/dev/zero of=/www/big bs=1M count=" + strconv.Itoa(bigPage>>20) + " 2>/dev/null && exec httpd -f -p 8080 -h /www"}

// BenchmarkPortForward times kubectl port-forward's path (crictl
// port-forward, containerd's CRI streaming server, its dial of localhost in
// the pod's namespace) to a busybox httpd in a pod, with runc and with
// cocoon's one VM per pod, side by side in one containerd: a connection
// set up and a small page fetched through it (connect), and bigPage bytes
// fetched (throughput, in MB/s):
//
//	go test -run '^$' -bench BenchmarkPortForward -benchtime 20x ./cri/e2e/
func BenchmarkPortForward(b *testing.B) {
	n, rt := startPodVMBenchNode(b)
	for _, handler := range []string{devstack.RuncHandler, devstack.CocoonHandler} {
		local, stop := n.forwardedWeb(b, rt, handler)
		b.Run("connect/handler="+handler, func(b *testing.B) {
			for range b.N {
				if page, err := n.fetchForwarded(b, local, "/"); err != nil || len(page) == 0 {
					b.Fatalf("fetch the page through the forward: %q, %v", page, err)
				}
			}
		})
		b.Run("throughput/handler="+handler, func(b *testing.B) {
			b.SetBytes(bigPage)
			for range b.N {
				var got countWriter
				if err := n.getForwarded(b, local, "/big", &got); err != nil || got != bigPage {
					b.Fatalf("fetch %d bytes through the forward: got %d, %v", bigPage, got, err)
				}
			}
		})
		stop()
	}
}

// forwardedWeb runs a pod with handler serving webBenchArgs, forwards its
// port 8080 and returns the local port, and a func that ends the forward
// and removes the pod.
func (n *node) forwardedWeb(b *testing.B, rt runtimeapi.RuntimeServiceClient, handler string) (int, func()) {
	cfg := n.podSandboxConfig("web-"+handler, nil)
	resp, err := rt.RunPodSandbox(context.Background(), &runtimeapi.RunPodSandboxRequest{Config: cfg, RuntimeHandler: handler})
	if err != nil {
		b.Fatalf("run pod with %s: %v", handler, err)
	}
	pod := benchPod{id: resp.PodSandboxId, config: cfg}
	web := startContainer(b, rt, pod, containerConfig("web", busyboxRef, webBenchArgs, nil))
	// crictl port-forward, as kubectl's, ends at the first connection the
	// pod refuses: forward once the server answers inside.
	testenv.Eventually(b, time.Minute, "the web server", func() error {
		resp, err := rt.ExecSync(context.Background(), &runtimeapi.ExecSyncRequest{ContainerId: web,
			Cmd: []string{"wget", "-q", "-O-", "http://127.0.0.1:8080/"}, Timeout: 10})
		if err == nil && !strings.Contains(string(resp.GetStdout()), podPage) {
			err = fmt.Errorf("wget: %q %q", resp.GetStdout(), resp.GetStderr())
		}
		return err
	})
	local, stopForward := n.portForward(b, pod.id, 8080)
	return local, func() {
		stopForward()
		n.removePod(b, rt, pod)
	}
}

// countWriter counts what is written to it.
type countWriter int

func (c *countWriter) Write(p []byte) (int, error) {
	*c += countWriter(len(p))
	return len(p), nil
}
