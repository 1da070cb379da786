// Package soak restores many VMs through containerd, the cocoon snapshotter
// and the cocoon shim, mixed copy and mmap, several at a time, killing the
// task, the shim or QEMU in some of them at random points of their life,
// and checks that the stack ends where it began: the same processes,
// descriptors, mounts, staged dirs, flat-file links, cgroups, run dirs,
// taps, network namespaces, leases and snapshots. `make soak` runs 1000
// restores (cocoon-bench soak); a short run is a test in `make test`.
//
//	res, err := soak.Run(ctx, soak.Options{BinDir: "bin", Image: img, Restores: 1000})
//	if err != nil { ... }            // the stack could not be set up
//	fmt.Print(res.Markdown())
//	if err := res.Err(); err != nil { ... } // a failed restore or a count that moved
package soak

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"google.golang.org/grpc"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
	"github.com/cocoonstack/containerd-shim-cocoon/network"
)

// Image is a snapshot image to restore: an OCI archive and its reference.
type Image struct {
	Ref, Archive string
}

// Options shape a soak.
type Options struct {
	// BinDir holds containerd, ctr, cocoon-snapshotter and the shim.
	BinDir string
	// Image is the snapshot image (a chain), also the ordinary image's base.
	Image Image
	// Restores is how many restores run; Parallel how many at a time (8
	// when 0).
	Restores, Parallel int
	// KillRate is the share of restores killed on purpose.
	KillRate float64
	// OrdinaryShare is the share of restores of the busybox image on the
	// base snapshot; 0 runs none.
	OrdinaryShare float64
	// Pods is how many pods run among the restores: a sandbox whose task
	// restores the pod's VM from PodImage (shim.pod_vm = "pod") and
	// containers of the busybox image joining it, one killed and replaced,
	// one running an exec.
	Pods int
	// PodImage is the pods' base snapshot, baked with disk slots for
	// their containers; needed when Pods > 0.
	PodImage Image
	// Spares, when positive, has that many spare task servers wait, each
	// restoring a VM ahead (shim.pooled_vm) for the next task to claim.
	Spares int
	// HostileShare is the share of restores given a hostile input (a
	// FIFO or an nfs mount to refuse, links out of a bind, ...); those
	// needing mounts go to ordinary-image restores only.
	HostileShare float64
	// Seed lays out the plans; a random one when 0.
	Seed uint64
	// Progress, when set, gets a line now and then.
	Progress io.Writer
	// SettleTimeout bounds the wait for the counts to come back after the
	// last restore (2 minutes when 0).
	SettleTimeout time.Duration
	// RestoreTimeout bounds one restore (4 minutes when 0).
	RestoreTimeout time.Duration
	// LogLevel is containerd's and the snapshotter's, and so the shims';
	// "info" when empty.
	LogLevel string
	// Logs, when set, is a file that gets containerd's and the
	// snapshotter's logs (the shims' included) once the soak is over.
	Logs string
}

func (o *Options) check() error {
	switch {
	case o.BinDir == "":
		return errors.New("soak: no bin dir: want the directory make build fills")
	case o.Image.Ref == "" || o.Image.Archive == "":
		return errors.New("soak: no snapshot image: want its archive and reference")
	case o.Restores < 1:
		return fmt.Errorf("soak: %d restores: want at least 1", o.Restores)
	case o.Pods < 0 || (o.Pods > 0 && (o.PodImage.Ref == "" || o.PodImage.Archive == "")):
		return fmt.Errorf("soak: %d pods with pod image %q: want none, or a pod image (a snapshot image baked with disk slots)", o.Pods, o.PodImage.Ref)
	case o.Parallel < 0, o.KillRate < 0 || o.KillRate > 1, o.OrdinaryShare < 0 || o.OrdinaryShare > 1,
		o.HostileShare < 0 || o.HostileShare > 1:
		return fmt.Errorf("soak: parallel %d, kill rate %g, ordinary share %g, hostile share %g: want parallel >= 0 and shares in [0, 1]",
			o.Parallel, o.KillRate, o.OrdinaryShare, o.HostileShare)
	}
	if o.Parallel == 0 {
		o.Parallel = 8
	}
	if o.SettleTimeout == 0 {
		o.SettleTimeout = 2 * time.Minute
	}
	if o.RestoreTimeout == 0 {
		o.RestoreTimeout = 4 * time.Minute
	}
	if o.LogLevel == "" {
		o.LogLevel = "info"
	}
	if o.Seed == 0 {
		o.Seed = randomSeed()
	}
	return nil
}

// soak is a run in progress.
type soak struct {
	opts     Options
	stack    *devstack.Stack
	client   *client.Client
	snConn   *grpc.ClientConn
	images   map[ImageKind]client.Image
	pairs    pairs
	hostile  *hostileFixture
	tapNames map[string]struct{}
	// podOptions are the pods' runtime options: the config with one VM
	// per pod.
	podOptions any
	// randomContent is the busybox image's testimage.RandomFile.
	randomContent string
}

// Run starts a private containerd, imports the images, warms the caches
// up, counts, runs the restores, lets the stack settle, counts again and
// tears the stack down. The error is for a soak that could not run; its
// findings are in the Result (Result.Err).
func Run(ctx context.Context, opts Options) (res *Result, err error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	runID := randomHex(3)
	stack, err := devstack.Start(ctx, devstack.Options{
		BinDir: opts.BinDir, Namespace: "soak-" + runID, Config: stackConfig(opts), LogLevel: opts.LogLevel,
	})
	if err != nil {
		return nil, err
	}
	dir := stack.Dir
	s := &soak{opts: opts, stack: stack, tapNames: map[string]struct{}{}}
	defer func() {
		if opts.Logs != "" {
			err = errors.Join(err, os.WriteFile(opts.Logs, []byte(stack.Logs()), 0o644))
		}
		if err != nil {
			err = fmt.Errorf("%w\n%s", err, tail(stack.Logs(), logTail))
		}
		if cerr := s.close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
		if res != nil {
			res.Teardown = devstack.Leftovers(dir)
		}
	}()
	if err := s.setup(ctx); err != nil {
		return nil, err
	}
	plans := withPods(makePlans(runID, opts.Restores, opts.KillRate, opts.OrdinaryShare, opts.HostileShare, opts.Seed), runID, opts.Pods)
	for _, p := range append(plans, s.warmups(runID)...) {
		s.tapNames[network.TapName(p.ID)] = struct{}{}
	}
	return s.run(ctx, runID, plans)
}

// stackConfig is the shims' config: the annotation picks the mode, strict
// makes a mode QEMU cannot do fail rather than fall back, the base image is
// the snapshot image, and timeouts suit many TCG guests on a busy host.
func stackConfig(o Options) *config.Config {
	cfg := devstack.Unpooled()
	cfg.Restore.AllowAnnotation = true
	cfg.Restore.Strict = true
	if o.OrdinaryShare > 0 {
		cfg.Restore.BaseImage = o.Image.Ref
	}
	cfg.Agent.ConnectTimeout = config.Duration(2 * time.Minute)
	cfg.Agent.CallTimeout = config.Duration(time.Minute)
	cfg.Shim.RestoreTimeout = config.Duration(3 * time.Minute)
	if o.Spares > 0 {
		cfg.Shim.PooledVM, cfg.Shim.Spares = true, o.Spares
	}
	return &cfg
}

func (s *soak) close() error {
	var errs []error
	if s.snConn != nil {
		errs = append(errs, s.snConn.Close())
	}
	errs = append(errs, s.stack.Close())
	return errors.Join(append(errs, s.hostile.close())...)
}

// run warms up, counts, restores, settles and counts again.
func (s *soak) run(ctx context.Context, runID string, plans []Plan) (*Result, error) {
	for _, p := range s.warmups(runID) {
		if o := s.restore(ctx, p); o.Err != nil {
			return nil, fmt.Errorf("warm-up restore %s: %w", p, o.Err)
		}
	}
	if err := s.drainPools(ctx, runID, "before"); err != nil {
		return nil, err
	}
	before, err := s.settle(ctx, nil)
	if err != nil {
		return nil, err
	}
	res := &Result{Options: s.opts, Before: before, Started: time.Now()}
	res.Outcomes = s.restoreAll(ctx, plans)
	res.Wall = time.Since(res.Started)
	if err := s.drainPools(ctx, runID, "after"); err != nil {
		return nil, err
	}
	if res.After, err = s.settle(ctx, before); err != nil {
		return nil, err
	}
	res.Moved = Diff(before, res.After)
	return res, nil
}

// warmups are restores before the first count, one per image and mode, so
// the counts start with the caches filled: the flat memory file, the
// filesystem image, the namespace's cgroup parents.
func (s *soak) warmups(runID string) []Plan {
	var out []Plan
	for _, img := range []ImageKind{ImageChain, ImageOrdinary} {
		if _, ok := s.images[img]; !ok {
			continue
		}
		for _, m := range []hypervisor.Mode{hypervisor.ModeCopy, hypervisor.ModeMmap} {
			out = append(out, Plan{Index: -1, ID: fmt.Sprintf("%s-warm-%s-%s", runID, img, m), Mode: m, Image: img, Net: NetPair})
		}
	}
	if s.opts.Pods > 0 {
		out = append(out, Plan{Index: -1, ID: runID + "-warm-pod", Mode: hypervisor.ModeMmap, Image: ImageOrdinary, Net: NetNew, Pod: true})
	}
	return out
}

// drainPools runs, with pooled VMs on, one restore after another that
// no pooled VM suits (an ordinary image sharing a directory of the host
// with its guest: the empty directory's bind), as many as spares wait:
// each takes the longest-waiting spare, closing its VM, and its server
// puts a spare with no order in its place. The counts are then taken
// with no VM waiting, before and after.
func (s *soak) drainPools(ctx context.Context, runID, when string) error {
	for i := range s.opts.Spares {
		p := Plan{Index: -1, ID: fmt.Sprintf("%s-drain-%s-%d", runID, when, i), Mode: hypervisor.ModeMmap, Image: ImageOrdinary, Net: NetPair, Hostile: HostileEmptyDir}
		if o := s.restore(ctx, p); o.Err != nil {
			return fmt.Errorf("drain the pooled VMs: restore %s: %w", p, o.Err)
		}
	}
	return nil
}

// restoreAll runs plans, Parallel at a time, each under RestoreTimeout.
func (s *soak) restoreAll(ctx context.Context, plans []Plan) []Outcome {
	out := make([]Outcome, len(plans))
	next := make(chan int)
	done := make(chan int)
	for range s.opts.Parallel {
		go func() {
			for i := range next {
				rctx, cancel := context.WithTimeout(ctx, s.opts.RestoreTimeout)
				out[i] = s.restore(rctx, plans[i])
				cancel()
				done <- i
			}
		}()
	}
	go func() {
		for i := range plans {
			next <- i
		}
		close(next)
	}()
	p := newProgress(s.opts.Progress, len(plans))
	for range plans {
		p.add(out[<-done])
	}
	return out
}

// settle waits until the stack is back to want (or, with want nil, until
// no task is left, the spares are up and two counts in a row agree),
// collecting containerd's garbage first each time, and returns the last
// count.
func (s *soak) settle(ctx context.Context, want Census) (Census, error) {
	ctx = namespaces.WithNamespace(ctx, s.stack.Namespace)
	deadline := time.Now().Add(s.opts.SettleTimeout)
	var last Census
	for {
		if err := s.collectGarbage(ctx); err != nil {
			return nil, err
		}
		c, err := s.take(ctx)
		if err != nil {
			return nil, err
		}
		if want != nil && len(Diff(want, c)) == 0 {
			return c, nil
		}
		if want == nil && idle(c) && s.sparesUp(c) && last != nil && len(Diff(last, c)) == 0 {
			return c, nil
		}
		if time.Now().After(deadline) {
			return c, nil
		}
		last = c
		sleep(ctx, time.Second)
	}
}

// sparesUp reports whether every spare of the stack's config waits, up:
// each holds a connection to containerd, so the counts before and after
// compare only with the same spares up.
func (s *soak) sparesUp(c Census) bool {
	n, _ := c.Get(CountSpares)
	return n.Value == stackConfig(s.opts).Shim.Spares
}

// idle reports whether c has no task, container, shim or VM.
func idle(c Census) bool {
	for _, name := range []string{CountShims, CountQEMU, CountTasks, CountContainers} {
		if n, _ := c.Get(name); n.Value != 0 {
			return false
		}
	}
	return true
}

// logTail bounds the daemons' log a failed soak prints.
const logTail = 64 << 10

// tail is the last n bytes of s, from a line start.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return "...\n" + s
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func randomSeed() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	var v uint64
	for _, x := range b {
		v = v<<8 | uint64(x)
	}
	return max(v%math.MaxInt64, 1)
}
