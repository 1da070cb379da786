package vm

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/restore"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/baseimage"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
)

// TestOrderOf: only an ordinary image on a base (a pod's VM too) or a
// snapshot image, sharing no directories, can run in a pooled VM, with
// any network, and its order names its containerd, namespace, config and
// base image.
func TestOrderOf(t *testing.T) {
	req := task.LaunchRequest{Containerd: "/c.sock", Namespace: "ns", ConfigPath: "/etc/c.toml"}
	ordinary := func() prepared {
		return prepared{src: source{base: &baseimage.Snapshot{Image: "base:1"}, disk: &chain.StagedRootfs{}}}
	}
	key := poolKey{Containerd: "/c.sock", Namespace: "ns", ConfigPath: "/etc/c.toml"}
	ordinaryOrder, imageOrder := PoolOrder{poolKey: key, Image: "base:1"}, PoolOrder{poolKey: key}
	// A pod's VM orders the pod's warm-up too.
	podOrder := PoolOrder{poolKey: key, Image: "base:1", Pod: true}
	pod := req
	pod.Spec = &specs.Spec{Annotations: map[string]string{"io.kubernetes.cri.container-type": "sandbox"}}
	pause := req
	pause.Spec = &specs.Spec{Annotations: map[string]string{"io.kubernetes.cri.container-type": "sandbox", "io.kubernetes.cri.sandbox-name": "web"}}
	bare := req
	bare.Bare = true
	snapshot := func(p *prepared) { p.src.base, p.src.disk = nil, nil }
	for _, tc := range []struct {
		name string
		r    task.LaunchRequest
		p    func(*prepared)
		want *PoolOrder
	}{
		{"an ordinary image", req, func(*prepared) {}, &ordinaryOrder},
		{"in a namespace of the shim's making", req, func(p *prepared) { p.net = &vmNetwork{} }, &ordinaryOrder},
		{"a snapshot image (its top layer asked later)", req, snapshot, &imageOrder},
		{"a bare VM with no base", bare, snapshot, nil},
		{"a pod sandbox's image", pod, func(*prepared) {}, &ordinaryOrder},
		{"a pod's VM (the guest's own pause)", pause, func(p *prepared) { p.src.disk = nil }, &podOrder},
		{"a bare pod VM on a base (containerd's sandbox API)", bare, func(p *prepared) { p.src.disk = nil }, &podOrder},
		{"shared directories", req, func(p *prepared) {
			p.guest.BeforeInit = func(context.Context, *agent.Client) error { return nil }
		}, nil},
		{"a namespace the spec names", req, func(p *prepared) { p.net = &vmNetwork{path: "/run/netns/cni"} }, &ordinaryOrder},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := ordinary()
			tc.p(&p)
			got, ok := orderOf(tc.r, &p)
			if ok != (tc.want != nil) || (ok && got != *tc.want) {
				t.Errorf("orderOf = %+v, %v; want %+v", got, ok, tc.want)
			}
		})
	}
}

// pooledForTest is a deferred restore by the fake driver, as the pool
// keeps it.
func pooledForTest(t *testing.T, o PoolOrder) *pooledVM {
	t.Helper()
	d := &fakeDriver{t: t, sys: &nopSystem{}}
	res, err := restore.Run(context.Background(), d, restore.Request{StagedDir: stageChain(t),
		RunDir: filepath.Join(t.TempDir(), "vm"), Plan: restore.Plan{Mode: hypervisor.ModeMmap},
		AgentTimeout: 10 * time.Second, Deferred: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Agent.Close(); res.VM.Close() })
	return &pooledVM{order: o, mode: hypervisor.ModeMmap, driver: "fake", top: "sha256:top", res: res,
		callTimeout: 10 * time.Second, claiming: make(chan struct{})}
}

// TestPoolTake: a launch takes the pooled VM only if it matches its order,
// restore mode, driver and chain; one that does not is closed (its
// hypervisor killed). Either way the pool is done. A launch of the
// order waits for a fill that is restoring, until its context ends; a
// fill of another order, or not restoring yet, is cancelled.
func TestPoolTake(t *testing.T) {
	o := PoolOrder{poolKey: poolKey{Containerd: "/c.sock", Namespace: "ns"}, Image: "base:1"}
	other := o
	other.Namespace = "other"
	for _, tc := range []struct {
		name   string
		order  PoolOrder
		mode   hypervisor.Mode
		driver string
		top    string
		taken  bool
	}{
		{"match", o, hypervisor.ModeMmap, "fake", "sha256:top", true},
		{"another order", other, hypervisor.ModeMmap, "fake", "sha256:top", false},
		{"another mode", o, hypervisor.ModeCopy, "fake", "sha256:top", false},
		{"another driver", o, hypervisor.ModeMmap, "qemu", "sha256:top", false},
		{"another chain", o, hypervisor.ModeMmap, "fake", "sha256:other", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pv := pooledForTest(t, o)
			p := newTestPool(o)
			p.vm = pv
			close(p.restoring)
			close(p.ready)
			got := p.take(context.Background(), tc.order.poolKey, tc.mode, tc.driver, tc.top)
			if (got != nil) != tc.taken {
				t.Fatalf("take = %v, want taken %v", got, tc.taken)
			}
			if again := p.take(context.Background(), o.poolKey, hypervisor.ModeMmap, "fake", "sha256:top"); again != nil {
				t.Error("a second take got the VM")
			}
			wait := 5 * time.Second // for a VM to be killed; one taken stays
			if tc.taken {
				wait = 100 * time.Millisecond
			}
			if killed := pv.res.VM.Wait(ctxWithin(t, wait)) == nil; killed == tc.taken {
				t.Errorf("hypervisor killed %v, want %v", killed, !tc.taken)
			}
		})
	}
	var nilPool *Pool
	if nilPool.take(context.Background(), o.poolKey, hypervisor.ModeMmap, "fake", "sha256:top") != nil {
		t.Error("a nil pool gave a VM")
	}
	nilPool.Close()
	for name, p := range map[string]*testPool{"another order's": newTestPool(other), "not restoring yet": newTestPool(o)} {
		if p.take(context.Background(), o.poolKey, hypervisor.ModeMmap, "fake", "sha256:top") != nil || !p.taken || p.fillCtx.Err() == nil {
			t.Errorf("a pool filling, %s: want no VM at once, the fill cancelled and the pool done", name)
		}
	}
	filling := newTestPool(o)
	close(filling.restoring)
	go func() {
		time.Sleep(50 * time.Millisecond)
		filling.mu.Lock()
		filling.vm = pooledForTest(t, o)
		filling.mu.Unlock()
		close(filling.ready)
	}()
	if filling.take(context.Background(), o.poolKey, hypervisor.ModeMmap, "fake", "sha256:top") == nil {
		t.Error("a pool filling for the launch's order: want its VM, waited for")
	}
	stuck := newTestPool(o)
	close(stuck.restoring)
	if stuck.take(ctxWithin(t, 50*time.Millisecond), o.poolKey, hypervisor.ModeMmap, "fake", "sha256:top") != nil || !stuck.taken {
		t.Error("a fill that does not end: want no VM once the launch's context ends, and the pool done")
	}
}

// TestPooledVMUsable: a pooled VM whose hypervisor still runs is usable;
// one that exited while it waited is not, and says so.
func TestPooledVMUsable(t *testing.T) {
	pv := pooledForTest(t, PoolOrder{})
	if err := pv.usable(context.Background()); err != nil {
		t.Fatalf("a running pooled VM: %v", err)
	}
	if err := pv.res.VM.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := pv.res.VM.Wait(ctxWithin(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := pv.usable(context.Background()); err == nil || !strings.Contains(err.Error(), "exited") {
		t.Errorf("a pooled VM whose hypervisor was killed: %v, want it unusable", err)
	}
}

// TestWarmStepUnderClaim: a warm-up step of a VM nobody claimed has no
// deadline (at idle priority on a busy machine it may wait long); once a
// claim begins, the step has callTimeout to end. One that ends in time
// leaves the VM to the claim; one cut short leaves it unusable.
func TestWarmStepUnderClaim(t *testing.T) {
	for _, tc := range []struct {
		name    string
		endsIn  time.Duration // after the claim begins
		wantErr bool
	}{
		{"ends in time", 10 * time.Millisecond, false},
		{"cut short", time.Hour, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pv := pooledForTest(t, PoolOrder{})
			pv.callTimeout = 200 * time.Millisecond
			running := make(chan struct{})
			stepErr := make(chan error, 1)
			go func() {
				_, err := pv.warmStep(context.Background(), func(ctx context.Context) error {
					close(running)
					<-pv.claiming
					select {
					case <-time.After(tc.endsIn):
						return nil
					case <-ctx.Done():
						return ctx.Err()
					}
				})
				stepErr <- err
			}()
			<-running
			time.Sleep(3 * pv.callTimeout) // unclaimed: no deadline
			select {
			case err := <-stepErr:
				t.Fatalf("a step nobody claimed ended after 3 call timeouts: %v", err)
			default:
			}
			err := pv.claim(context.Background())
			if (err != nil) != tc.wantErr || (err != nil && !errors.Is(err, errWarmCut)) {
				t.Errorf("claim = %v, want an error %v", err, tc.wantErr)
			}
			if done, err := pv.warmStep(context.Background(), func(context.Context) error { return errors.New("ran") }); !done || err != nil {
				t.Errorf("a step after the claim: done %v, %v; want done and not run", done, err)
			}
		})
	}
}

// newTestPool is a pool of order o whose fill has begun; fillCtx is the
// context its cancel ends.
func newTestPool(o PoolOrder) *testPool {
	ctx, cancel := context.WithCancel(context.Background())
	return &testPool{Pool: &Pool{order: o, restoring: make(chan struct{}), ready: make(chan struct{}), cancel: cancel}, fillCtx: ctx}
}

type testPool struct {
	*Pool
	fillCtx context.Context
}

func ctxWithin(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestLockFills: one fill restores at a time; the next waits for its
// unlock, or gives up when its context ends (a launch cancelled it).
func TestLockFills(t *testing.T) {
	dir, runDir := t.TempDir(), t.TempDir()
	unlock, err := lockFills(t.Context(), dir, runDir)
	if err != nil {
		t.Fatal(err)
	}
	fillWaits(t, dir, runDir, "second fill while the first restores")
	got := make(chan error, 1)
	go func() {
		unlock2, err := lockFills(t.Context(), dir, runDir)
		if err == nil {
			unlock2()
		}
		got <- err
	}()
	time.Sleep(3 * flockPoll)
	unlock()
	fillEnds(t, got, "the waiting fill did not get the lock once the first let go")
}

// fillWaits checks that a fill's turn in dir and runDir does not come
// within a few polls (what: the case, for the failure).
func fillWaits(t *testing.T, dir, runDir, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*flockPoll)
	defer cancel()
	if _, err := lockFills(ctx, dir, runDir); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%s: %v, want it to wait until its context ends", what, err)
	}
}

// fillEnds waits for a fill's result on got, failing with late if none
// comes in time.
func fillEnds(t *testing.T, got <-chan error, late string) {
	t.Helper()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal(late)
	}
}

// TestFillsYieldToLaunches: a fill's turn waits while launches are under
// way in the run dir (two at once, both holding it), and comes once the
// last ends; a launch never waits for a fill.
func TestFillsYieldToLaunches(t *testing.T) {
	dir, runDir := t.TempDir(), filepath.Join(t.TempDir(), "run")
	releases := make([]func(), 2)
	for i := range releases {
		release, err := holdLaunch(runDir)
		if err != nil {
			t.Fatalf("launch %d: %v", i, err)
		}
		releases[i] = release
	}
	fillWaits(t, dir, runDir, "fill during launches")
	got := make(chan error, 1)
	go func() {
		unlock, err := lockFills(t.Context(), dir, runDir)
		if err == nil {
			release, herr := holdLaunch(runDir) // a launch during the fill's restore
			if herr == nil {
				release()
			}
			unlock()
			err = herr
		}
		got <- err
	}()
	releases[0]()
	time.Sleep(3 * flockPoll)
	select {
	case err := <-got:
		t.Fatalf("fill began with a launch still under way: %v", err)
	default:
	}
	releases[1]()
	fillEnds(t, got, "the fill did not begin once the launches ended")
}

// TestWarmContainerSpec: the warm-up's container is containerd's default
// one as a pod's VM takes it: no network namespace of its own, the
// default seccomp profile, a program every root has.
func TestWarmContainerSpec(t *testing.T) {
	spec, files, err := warmContainerSpec(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Each file CRI binds into a pod's container is bound from a copy the
	// create sends, under the container's bind dir, as a join's are.
	for _, dst := range guestFiles {
		i := slices.IndexFunc(spec.Mounts, func(m specs.Mount) bool { return m.Destination == dst })
		if i < 0 {
			t.Errorf("no bind at %s: %+v", dst, spec.Mounts)
			continue
		}
		m := spec.Mounts[i]
		sent := slices.ContainsFunc(files, func(f agent.File) bool { return f.Path == m.Source })
		if m.Type != "bind" || !sent || !strings.HasPrefix(m.Source, memberBindSources(warmJoinID)+"/") {
			t.Errorf("bind at %s from %s (%s), sent %v: want a bind of a file the create sends, under %s", dst, m.Source, m.Type, sent, memberBindSources(warmJoinID))
		}
	}
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			t.Errorf("the warm-up container has a network namespace: %+v", spec.Linux.Namespaces)
		}
	}
	if len(spec.Linux.Namespaces) < 4 || spec.Linux.Seccomp == nil || len(spec.Linux.Seccomp.Syscalls) == 0 {
		t.Errorf("namespaces %+v, seccomp %v: want containerd's default namespaces but the network and its default profile", spec.Linux.Namespaces, spec.Linux.Seccomp != nil)
	}
	if !slices.Equal(spec.Process.Args, []string{"/proc/self/exe"}) {
		t.Errorf("args %q, want /proc/self/exe", spec.Process.Args)
	}
}
