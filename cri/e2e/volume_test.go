package e2e

import (
	"fmt"
	"os"
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
// both keys "one" (large: with the keys of largeKeys), and returns it with
// an edit mounting it read-only at /cfg, as kubelet mounts a ConfigMap.
func liveVolumeDir(t testing.TB, large bool) (string, func(*runtimeapi.ContainerConfig)) {
	dir := filepath.Join(t.TempDir(), "pods", "uid", "volumes", "kubernetes.io~configmap", "cfg")
	testenv.WriteVolumeVersion(t, dir, "..v1", volumeKeys("one", large))
	return dir, func(c *runtimeapi.ContainerConfig) {
		c.Mounts = append(c.Mounts, &runtimeapi.Mount{ContainerPath: "/cfg", HostPath: dir, Readonly: true})
	}
}

// largeKeys and largeKey make a volume more than one agent request
// carries: that many keys besides a and b, and a key "big" of that size.
const (
	largeKeys = 150
	largeKey  = 3 << 19
)

// volumeKeys are a version of a live volume: keys a and b holding word;
// a large one has largeKeys more and "big", of largeKey bytes.
func volumeKeys(word string, large bool) map[string]string {
	keys := map[string]string{"a": word, "b": word}
	if large {
		for i := range largeKeys {
			keys[fmt.Sprintf("k%03d", i)] = word
		}
		keys["big"] = strings.Repeat(word, largeKey/len(word)+1)[:largeKey]
	}
	return keys
}

// checkLiveVolume updates the volume at dir as kubelet does while reader
// (running volumeReaderArgs on it) reads: the update shows, and no read
// mixes the two versions; a large volume is whole before and after.
func (n *node) checkLiveVolume(t *testing.T, reader, dir string) {
	t.Helper()
	_, err := os.Stat(filepath.Join(dir, "big"))
	large := err == nil
	n.waitLogs(t, reader, "read one-one")
	n.checkVolumeSize(t, reader, large)
	began := time.Now()
	testenv.WriteVolumeVersion(t, dir, "..v2", volumeKeys("two", large))
	n.waitLogs(t, reader, "read two-two")
	t.Logf("the update showed in the container's reads within %s", time.Since(began).Round(10*time.Millisecond))
	n.checkVolumeSize(t, reader, large)
	logs := n.crictl(t, "logs", reader)
	for _, mixed := range []string{"read one-two", "read two-one"} {
		if strings.Contains(logs, mixed) {
			t.Fatalf("a read mixed the volume's versions: %q in\n%s", mixed, logs)
		}
	}
}

// checkVolumeSize checks a large volume at /cfg has all its keys, and
// its big key all its bytes, through the current ..data.
func (n *node) checkVolumeSize(t *testing.T, ctr string, large bool) {
	t.Helper()
	if !large {
		return
	}
	out := n.crictl(t, "exec", "-s", ctr, "sh", "-c", "ls /cfg | wc -l; wc -c < /cfg/big")
	if want := fmt.Sprintf("%d\n%d", largeKeys+3, largeKey); strings.Join(strings.Fields(out), "\n") != want {
		t.Fatalf("the large volume in the guest: %q, want %d keys and %d bytes in big", out, largeKeys+3, largeKey)
	}
}
