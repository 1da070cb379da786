package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/ctrdtest"
	"github.com/cocoonstack/containerd-shim-cocoon/network"
)

// insideEnv makes TestHostNetNSInside run: TestHostNetNS sets it to the
// baked test image's archive and the stand-in host namespace's path.
const insideEnv = "COCOON_E2E_HOST_NETNS"

// runWithin is run with the whole ctr call bounded by d.
func runWithin(c *ctrdtest.Containerd, d time.Duration, flags []string, id string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	argv := append([]string{"run", "--runtime", runtimeName, "--snapshotter", ctrdtest.Snapshotter, "--fifo-dir", c.FifoDir}, flags...)
	argv = append(argv, imageRef, id)
	return c.Stack.Ctr(ctx, append(argv, args...)...)
}

// TestNetNSFIFO: a FIFO as the task's network namespace path fails the
// create at once, saying what the path is, and leaves nothing behind; the
// shim's open of it used to block for good.
func TestNetNSFIFO(t *testing.T) {
	c := stack(t, "")
	fifo := filepath.Join(t.TempDir(), "netns")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := runWithin(c, 2*time.Minute, []string{"--rm", "--with-ns", "network:" + fifo}, "fifo", "true")
	want := fifo + ": a FIFO, not a network namespace"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("ctr run with a FIFO as network namespace: %v after %s, want an error containing %q", err, time.Since(start), want)
	}
	t.Logf("refused after %s", time.Since(start))
	noLeftovers(t, c)
}

// TestHostNetNS: the host's network namespace is refused before anything
// is made in it, its links and their qdiscs as they were. First with the
// stack in a namespace the test made, standing in for the host's (a
// refusal that failed there takes over only that namespace's interface),
// and only then with init's, the real host's.
func TestHostNetNS(t *testing.T) {
	archive := image(t)
	node := cniNode(t)
	fake := node.Attach(t, "fakehost")
	cmd := exec.Command("nsenter", "--net="+fake.Path, "--", os.Args[0],
		"-test.run", "^TestHostNetNSInside$", "-test.count", "1", "-test.v")
	cmd.Env = append(os.Environ(), insideEnv+"="+archive+":"+fake.Path)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestHostNetNSInside") {
		t.Fatalf("the stack in a namespace standing in for the host's: %v\n%s", err, out)
	}

	c := stack(t, "")
	want := network.ErrHostNamespace.Error()
	if err := unix.Access("/proc/1/ns/net", unix.R_OK); err != nil {
		// Some sandboxes close init's namespaces even to root: the shim
		// cannot open it either.
		want = "open /proc/1/ns/net: permission denied"
	}
	refuseHost(t, c, "/proc/1/ns/net", want)
}

// TestHostNetNSInside is TestHostNetNS's stack inside the namespace it
// made: that namespace, named by its path or by /proc/self from the shim,
// is the shim's own.
func TestHostNetNSInside(t *testing.T) {
	env := os.Getenv(insideEnv)
	if env == "" {
		t.Skip("runs inside TestHostNetNS, in the namespace it made")
	}
	archive, path, _ := strings.Cut(env, ":")
	bakeOnce.Do(func() { bakeArchive = archive })
	c := stack(t, "")
	for _, p := range []string{path, "/proc/self/ns/net"} {
		refuseHost(t, c, p, network.ErrHostNamespace.Error())
	}
}

// refuseHost runs a task in the network namespace at path, which the
// shim's process sees in its own namespace: the create must fail with want
// and leave the namespace's links and qdiscs, and the stack, as they were.
func refuseHost(t *testing.T, c *ctrdtest.Containerd, path, want string) {
	t.Helper()
	before := netState(t)
	_, err := runWithin(c, 2*time.Minute, []string{"--rm", "--with-ns", "network:" + path}, "hostns", "true")
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("ctr run --with-ns network:%s: %v, want an error containing %q", path, err, want)
	}
	noLeftovers(t, c)
	if after := netState(t); !slices.Equal(before, after) {
		t.Fatalf("network namespace changed by a refused task:\nbefore %v\nafter  %v", before, after)
	}
}

// netState lists the links of this process's network namespace with
// their flags, master and qdiscs: read through netlink, nothing sent.
func netState(t *testing.T) []string {
	t.Helper()
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		a := l.Attrs()
		qdiscs, err := netlink.QdiscList(l)
		if err != nil && !errors.Is(err, unix.ENODEV) {
			t.Fatal(err)
		}
		var kinds []string
		for _, q := range qdiscs {
			kinds = append(kinds, q.Type())
		}
		out = append(out, fmt.Sprintf("%d:%s %s flags=%v master=%d qdiscs=%v", a.Index, a.Name, l.Type(), a.Flags, a.MasterIndex, kinds))
	}
	return out
}
