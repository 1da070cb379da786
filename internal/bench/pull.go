package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/stackrun"
	"github.com/cocoonstack/containerd-shim-cocoon/network"
	"github.com/cocoonstack/containerd-shim-cocoon/restore"
)

// A node that has never seen the snapshot image: it pulls it from a
// registry and runs it, against pulling the same bytes as an ordinary
// image. The registry (crane's) serves on 127.0.0.1 in a network namespace
// the bench makes; each measurement gets a containerd and snapshotter of
// its own in that namespace, with nothing pulled yet.
const (
	PullSnapshot = "cocoon, the snapshot image"
	PullOrdinary = "overlayfs, the same bytes as an ordinary image"
	// pullRegistry is where the registry listens, in the bench's namespace.
	pullRegistry = "127.0.0.1:5000"
)

// PullRow is one arm on an empty node, medians: ctr image pull (fetch and
// unpack, by containerd's transfer service), then, for the snapshot image,
// its first `ctr run --rm … echo hi` (staging flattens the chain, then the
// restore).
type PullRow struct {
	Arm    string  `json:"arm"`
	Runs   int     `json:"runs"`
	PullMs float64 `json:"pullMs"`
	RunMs  float64 `json:"firstRunMs,omitempty"`
}

// PullResult is the empty-node measurement: the image's size in the
// registry, and each arm.
type PullResult struct {
	Bytes int64     `json:"bytes"`
	Rows  []PullRow `json:"rows"`
}

// pullNode is the registry serving the snapshot image in a namespace of
// the bench's.
type pullNode struct {
	ns       *network.Namespace
	registry *exec.Cmd
	ref      string
	bytes    int64
}

// measureEmptyNode measures the empty node with the shims' config.
func measureEmptyNode(ctx context.Context, out io.Writer, o Options, img stackrun.SnapshotImage, tmp string) (*PullResult, error) {
	cfg, err := shimConfig(img)
	if err != nil {
		return nil, err
	}
	return measurePull(ctx, out, o.BinDir, img, cfg, tmp, o.PullRounds)
}

// measurePull runs each arm rounds times on a new node, the arms taking
// turns.
func measurePull(ctx context.Context, out io.Writer, binDir string, img stackrun.SnapshotImage, cfg *config.Config, tmp string, rounds int) (_ *PullResult, retErr error) {
	n, err := startPullNode(ctx, binDir, img, tmp)
	if err != nil {
		return nil, err
	}
	defer func() { retErr = errors.Join(retErr, n.close()) }()
	arms := []string{PullSnapshot, PullOrdinary}
	samples := map[string][][2]time.Duration{}
	for round := range rounds {
		order := slices.Clone(arms)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, arm := range order {
			d, err := n.pullOnce(ctx, binDir, cfg, arm, fmt.Sprintf("pull-%d", round))
			if err != nil {
				return nil, fmt.Errorf("%s: %w", arm, err)
			}
			fmt.Fprintf(out, "round %d  empty node %-48s pull %8.1f ms  first run %8.1f ms\n", round+1, arm, ms(d[0]), ms(d[1]))
			samples[arm] = append(samples[arm], d)
		}
	}
	res := &PullResult{Bytes: n.bytes}
	for _, arm := range arms {
		res.Rows = append(res.Rows, pullRow(arm, samples[arm]))
	}
	return res, nil
}

func pullRow(arm string, samples [][2]time.Duration) PullRow {
	var pulls, runs []time.Duration
	for _, s := range samples {
		pulls, runs = append(pulls, s[0]), append(runs, s[1])
	}
	return PullRow{Arm: arm, Runs: len(samples), PullMs: ms(percentile(pulls, 0.5)), RunMs: ms(percentile(runs, 0.5))}
}

// startPullNode starts the registry in a new namespace and pushes the
// snapshot image's OCI layout into it.
func startPullNode(ctx context.Context, binDir string, img stackrun.SnapshotImage, tmp string) (*pullNode, error) {
	layout := filepath.Join(tmp, "pull-layout")
	if err := os.MkdirAll(layout, 0o755); err != nil {
		return nil, err
	}
	if out, err := exec.CommandContext(ctx, "tar", "-xf", img.Archive, "-C", layout).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("unpack the snapshot image's layout: %v: %s", err, out)
	}
	ns, err := network.New()
	if err != nil {
		return nil, err
	}
	n := &pullNode{ns: ns, ref: pullRegistry + "/cocoon/snapshot:bench"}
	crane := filepath.Join(binDir, "crane")
	n.registry = exec.Command("nsenter", "--net="+ns.Path(), "--", crane, "registry", "serve", "--address", pullRegistry)
	n.registry.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := n.registry.Start(); err != nil {
		return nil, errors.Join(fmt.Errorf("start the registry: %w", err), ns.Close())
	}
	if err := n.serve(ctx, crane, layout); err != nil {
		return nil, errors.Join(err, n.close())
	}
	return n, nil
}

// serve waits for the registry and pushes the layout, counting its bytes.
func (n *pullNode) serve(ctx context.Context, crane, layout string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := n.ns.Do(func() error {
			c, err := net.DialTimeout("tcp", pullRegistry, time.Second)
			if err == nil {
				c.Close()
			}
			return err
		})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the registry on %s: %w", pullRegistry, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	push := exec.CommandContext(ctx, "nsenter", "--net="+n.ns.Path(), "--", crane, "push", "--insecure", layout, n.ref)
	if out, err := push.CombinedOutput(); err != nil {
		return fmt.Errorf("push the snapshot image: %v: %s", err, out)
	}
	return filepath.WalkDir(filepath.Join(layout, "blobs"), func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err == nil {
			n.bytes += fi.Size()
		}
		return err
	})
}

// pullOnce pulls the image onto a new node (arm says with which
// snapshotter) and, for the snapshot image, runs it once: the pull's
// time, then the run's.
func (n *pullNode) pullOnce(ctx context.Context, binDir string, cfg *config.Config, arm, id string) (_ [2]time.Duration, retErr error) {
	var d [2]time.Duration
	st, err := devstack.Start(ctx, devstack.Options{BinDir: binDir, Config: cfg, NetNS: n.ns.Path(), LogLevel: "warn"})
	if err != nil {
		return d, err
	}
	defer func() { retErr = errors.Join(retErr, st.Close()) }()
	sn := devstack.Snapshotter
	if arm == PullOrdinary {
		sn = runcSnapshotter
	}
	began := time.Now()
	if _, err := st.Ctr(ctx, "image", "pull", "--plain-http", "--snapshotter", sn, n.ref); err != nil {
		return d, err
	}
	d[0] = time.Since(began)
	if arm == PullOrdinary {
		return d, nil
	}
	began = time.Now()
	out, err := st.Ctr(ctx, "run", "--rm", "--runtime", devstack.Runtime, "--snapshotter", sn,
		"--annotation", restore.AnnotationMode+"="+string(hypervisor.ModeMmap), n.ref, id, "echo", "hi")
	if err != nil || strings.TrimSpace(out) != "hi" {
		return d, fmt.Errorf("first run: %v, output %q, want \"hi\"", err, out)
	}
	d[1] = time.Since(began)
	return d, nil
}

func (n *pullNode) close() error {
	_ = n.registry.Process.Kill()
	_ = n.registry.Wait()
	return n.ns.Close()
}

// pullTable puts the empty node's arms side by side.
func (r *results) pullTable(b *strings.Builder) {
	if r.Pull == nil {
		return
	}
	fmt.Fprintf(b, "\nA node that has never seen the image: `ctr image pull` of the snapshot image (%.0f MiB in the registry, uncompressed layers) from a registry on 127.0.0.1 (crane's), "+
		"containerd and the snapshotter new for each run, then its first `ctr run --rm … echo hi` (staging flattens the chain, then the restore); medians.\n\n"+
		"| arm | runs | pull ms | first run ms | pull + first run ms |\n|---|---|---|---|---|\n", float64(r.Pull.Bytes)/(1<<20))
	for _, p := range r.Pull.Rows {
		if p.RunMs == 0 {
			fmt.Fprintf(b, "| %s | %d | %.0f | | |\n", p.Arm, p.Runs, p.PullMs)
			continue
		}
		fmt.Fprintf(b, "| %s | %d | %.0f | %.0f | %.0f |\n", p.Arm, p.Runs, p.PullMs, p.RunMs, p.PullMs+p.RunMs)
	}
}
