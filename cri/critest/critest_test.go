package critest_test

import (
	"bytes"
	"context"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/cri/critest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// The real run: the whole of critest v1.37.0 (make build puts it in bin/)
// against containerd 2.4.2's CRI, once with the runc handler and once with
// the cocoon handler, at the same time, each on a node of its own (host
// ports, NRI plugins and image removals are node-wide, so two runs on one
// containerd would see each other's), then the comparison (make test runs
// it; make critest also writes the result):
//
//	go test -count=1 -v -run TestCritest ./cri/critest/ -args -critest.out r.md
//	go test -count=1 -v -run TestCritest ./cri/critest/ -args -critest.focus 'Multiple Containers'
//	go test -count=1 -v -run TestCritest ./cri/critest/ -args -critest.container-vm
var (
	focus       = flag.String("critest.focus", "", "run only the specs this regexp matches (ginkgo's focus); the whole suite when empty")
	out         = flag.String("critest.out", "", "write the side-by-side result (markdown) to this file")
	keep        = flag.String("critest.keep", "", "keep each handler's ginkgo report and critest output in this dir")
	containerVM = flag.Bool("critest.container-vm", false, "run the cocoon handler with one VM per container (shim.pod_vm = \"container\") and judge it against "+allowedContainerVMList)
)

// The repo's lists of specs cocoon may fail while runc passes them, each
// with the issue that will fix it: one for each way the cocoon handler
// runs pods. make test judges one VM per pod, the way that conforms.
const (
	allowedList            = "allowed.txt"
	allowedContainerVMList = "allowed-container.txt"
)

// critestTimeout bounds one handler's critest run (ginkgo's own timeout,
// so a hung spec still leaves a report), within make test's 20 min.
const critestTimeout = 15 * time.Minute

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// run is one handler's critest run.
type run struct {
	report *critest.Report
	wall   time.Duration
}

func TestCritest(t *testing.T) {
	// Here, not only in the runs: a run that skips would leave nothing to
	// compare.
	testenv.RequireRoot(t)
	list := allowedList
	if *containerVM {
		list = allowedContainerVMList
	}
	allowed, err := critest.ReadAllowed(list)
	if err != nil {
		t.Fatal(err)
	}
	runs := map[string]*run{}
	var mu sync.Mutex
	t.Run("handlers", func(t *testing.T) {
		for _, h := range []string{devstack.RuncHandler, devstack.CocoonHandler} {
			t.Run(h, func(t *testing.T) {
				t.Parallel()
				r := startNode(t, h).critest(t, h)
				mu.Lock()
				runs[h] = r
				mu.Unlock()
			})
		}
	})
	if len(runs) != 2 {
		t.Fatal("a handler's critest run did not finish: nothing to compare")
	}
	scope := critest.Full
	if *focus != "" {
		scope = critest.Subset
	}
	cmp := critest.Compare(runs[devstack.RuncHandler].report, runs[devstack.CocoonHandler].report, allowed, scope)
	info := critest.Run{Date: time.Now().Format(time.DateOnly), Scope: scope,
		RuncWall: runs[devstack.RuncHandler].wall, CocoonWall: runs[devstack.CocoonHandler].wall}
	t.Logf("critest v1.37.0, runc and cocoon:\n%s", cmp.Summary(info))
	if *out != "" {
		writeResult(t, cmp, info)
	}
	if err := cmp.Err(); err != nil {
		t.Error(err)
	}
}

// critest runs critest against the node's CRI with handler and reads its
// report. critest exits non-zero when a spec fails: the report says which.
func (n *node) critest(t *testing.T, handler string) *run {
	t.Helper()
	dir := t.TempDir()
	// A spec whose container the runtime refuses by design (cocoon's
	// rshared) leaves its host mounts: critest's cleanup first unmounts
	// the mount it makes once the container runs, and stops there. They
	// go before the directory does.
	t.Cleanup(func() { unmountUnder(t, dir) })
	report := filepath.Join(dir, "report.json")
	endpoint := "unix://" + n.stack.Address
	args := []string{"--net=" + n.net.Path, "--", testenv.Bin(t, "critest"),
		"-runtime-endpoint=" + endpoint, "-image-endpoint=" + endpoint, "-runtime-handler=" + handler,
		"-nri-socket=" + n.nriSocket, "-config=" + filepath.Join(dir, "none.yaml"),
		"-ginkgo.json-report=" + report, "-ginkgo.no-color", "-ginkgo.timeout=" + critestTimeout.String()}
	if *focus != "" {
		args = append(args, "-ginkgo.focus="+*focus)
	}
	ctx, cancel := context.WithTimeout(context.Background(), critestTimeout+time.Minute)
	defer cancel()
	var output bytes.Buffer
	cmd := exec.CommandContext(ctx, "nsenter", args...)
	cmd.Stdout, cmd.Stderr = &output, &output
	// critest's multiple-containers specs leave their log dirs in TMPDIR:
	// this run's, removed with it.
	cmd.Env = append(os.Environ(), "TMPDIR="+dir)
	start := time.Now()
	err := cmd.Run()
	wall := time.Since(start)
	if *keep != "" {
		keepRun(t, handler, report, output.Bytes())
	}
	r, rerr := critest.ReadReport(report)
	if rerr != nil {
		t.Fatalf("critest with %s: %v (exit: %v); its output ends:\n%s", handler, rerr, err, tail(output.Bytes(), 8<<10))
	}
	t.Logf("critest with %s: %v in %s", handler, r.Count(), wall.Round(time.Second))
	return &run{report: r, wall: wall}
}

// writeResult writes the comparison as markdown to *out.
func writeResult(t *testing.T, cmp *critest.Comparison, info critest.Run) {
	t.Helper()
	var b bytes.Buffer
	if err := cmp.WriteMarkdown(&b, info); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(*out, b.Bytes(), 0o644); err != nil {
		t.Fatalf("write the critest result: %v", err)
	}
	t.Logf("wrote %s", *out)
}

// keepRun copies a handler's report and output into *keep.
func keepRun(t *testing.T, handler, report string, output []byte) {
	t.Helper()
	if err := os.MkdirAll(*keep, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(*keep, handler+".log"), output, 0o644); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(report); err == nil {
		if err := os.WriteFile(filepath.Join(*keep, handler+".json"), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// unmountUnder detaches every mount under dir, the deepest first.
func unmountUnder(t *testing.T, dir string) {
	infos, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		t.Errorf("read the mounts under %s: %v", dir, err)
		return
	}
	slices.SortFunc(infos, func(a, b *mountinfo.Info) int { return len(b.Mountpoint) - len(a.Mountpoint) })
	for _, mi := range infos {
		if err := unix.Unmount(mi.Mountpoint, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s, which critest left: %v", mi.Mountpoint, err)
			continue
		}
		t.Logf("unmounted %s, which critest left", mi.Mountpoint)
	}
}
