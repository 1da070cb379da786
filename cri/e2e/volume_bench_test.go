package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// fastReaderArgs are volumeReaderArgs reading fifty times a second.
var fastReaderArgs = []string{"sh", "-c",
	`while true; do (cd /cfg/..data && echo "read $(cat a)-$(cat b)"); sleep 0.02; done`}

// BenchmarkVolumeSync times a live volume's update, made on the host as
// kubelet makes it, until a container reading it (fifty times a second)
// logs the new version, with runc and with cocoon's one VM per pod, side
// by side in one containerd; p50 and p95 over b.N updates:
//
//	go test -run '^$' -bench BenchmarkVolumeSync -benchtime 50x ./cri/e2e/
func BenchmarkVolumeSync(b *testing.B) {
	n := startChainNode(b, nodeOptions{cocoonConfig: podVMConfig})
	if err := n.stack.Import(context.Background(), images.busyboxTar, devstack.Snapshotter); err != nil {
		b.Fatal(err)
	}
	rt := criClient(b, n.stack.Address)
	for _, handler := range []string{devstack.RuncHandler, devstack.CocoonHandler} {
		b.Run("handler="+handler, func(b *testing.B) {
			dir, mount := liveVolumeDir(b, false)
			name := fmt.Sprintf("sync-%s-%d", handler, b.N) // a log of its own per run
			cfg := n.podSandboxConfig(name, nil)
			resp, err := rt.RunPodSandbox(context.Background(), &runtimeapi.RunPodSandboxRequest{Config: cfg, RuntimeHandler: handler})
			if err != nil {
				b.Fatal(err)
			}
			pod := benchPod{id: resp.PodSandboxId, config: cfg}
			defer n.removePod(b, rt, pod)
			startContainer(b, rt, pod, containerConfig("reader", busyboxRef, fastReaderArgs, mount))
			log := &logTail{path: filepath.Join(n.stack.PodLogDir, name, "reader.log")}
			log.wait(b, "read one-one")
			delays := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				v := fmt.Sprintf("u%d", i) // never the first version's name
				began := time.Now()
				testenv.WriteVolumeVersion(b, dir, ".."+v, map[string]string{"a": v, "b": v})
				log.wait(b, "read "+v+"-"+v)
				delays = append(delays, time.Since(began))
			}
			b.StopTimer()
			slices.Sort(delays)
			b.ReportMetric(float64(delays[len(delays)/2].Milliseconds()), "p50-ms")
			b.ReportMetric(float64(delays[len(delays)*95/100].Milliseconds()), "p95-ms")
		})
	}
}

// logTail reads a container's log file as it grows.
type logTail struct {
	path string
	off  int64
}

// wait polls the log until a line holds want, from where the last wait
// stopped, for at most a minute.
func (l *logTail) wait(b *testing.B, want string) {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		data, err := os.ReadFile(l.path)
		if err == nil && int64(len(data)) > l.off {
			fresh := string(data[l.off:])
			if i := strings.Index(fresh, want); i >= 0 {
				l.off += int64(i + len(want))
				return
			}
			if j := strings.LastIndexByte(fresh, '\n'); j >= 0 {
				l.off += int64(j + 1)
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	b.Fatalf("%s: no line with %q within a minute", l.path, want)
}
