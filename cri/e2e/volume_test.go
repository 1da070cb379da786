package e2e

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// volumeReaderArgs read both keys of the volume at /cfg through one
// resolution of ..data, as an application reading a consistent set does,
// and log them, ten times a second.
var volumeReaderArgs = []string{"sh", "-c",
	`while true; do (cd /cfg/..data && echo "read $(cat a)-$(cat b)"); sleep 0.1; done`}

// liveVolumeDir makes a ConfigMap-shaped volume in a kubelet-like path,
// both keys "one", and returns it with an edit mounting it read-only at
// /cfg, as kubelet mounts a ConfigMap.
func liveVolumeDir(t testing.TB) (string, func(*runtimeapi.ContainerConfig)) {
	dir := filepath.Join(t.TempDir(), "pods", "uid", "volumes", "kubernetes.io~configmap", "cfg")
	testenv.WriteVolumeVersion(t, dir, "..v1", map[string]string{"a": "one", "b": "one"})
	return dir, func(c *runtimeapi.ContainerConfig) {
		c.Mounts = append(c.Mounts, &runtimeapi.Mount{ContainerPath: "/cfg", HostPath: dir, Readonly: true})
	}
}

// checkLiveVolume updates the volume at dir as kubelet does while reader
// (running volumeReaderArgs on it) reads: the update shows, and no read
// mixes the two versions.
func (n *node) checkLiveVolume(t *testing.T, reader, dir string) {
	t.Helper()
	n.waitLogs(t, reader, "read one-one")
	began := time.Now()
	testenv.WriteVolumeVersion(t, dir, "..v2", map[string]string{"a": "two", "b": "two"})
	n.waitLogs(t, reader, "read two-two")
	t.Logf("the update showed in the container's reads within %s", time.Since(began).Round(10*time.Millisecond))
	logs := n.crictl(t, "logs", reader)
	for _, mixed := range []string{"read one-two", "read two-one"} {
		if strings.Contains(logs, mixed) {
			t.Fatalf("a read mixed the volume's versions: %q in\n%s", mixed, logs)
		}
	}
}
