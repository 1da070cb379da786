package main

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/pause"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/vm"
)

// sandboxLauncher hands out sb, or fails with err.
type sandboxLauncher struct {
	sb  *task.Sandbox
	err error
}

func (l sandboxLauncher) Launch(context.Context, task.LaunchRequest) (*task.Sandbox, error) {
	return l.sb, l.err
}

// gatedRefill records the refills asked for; each waits for release.
type gatedRefill struct {
	release chan struct{}
	mu      sync.Mutex
	got     []string
}

func (g *gatedRefill) refill(containerd string, count int, env ...string) error {
	<-g.release
	g.mu.Lock()
	defer g.mu.Unlock()
	g.got = append(g.got, containerd)
	if count != 3 || !slices.Equal(env, []string{"ORDER=x"}) {
		return errors.New("wrong refill")
	}
	return nil
}

func newTestRefilling(sb *task.Sandbox, err error, g *gatedRefill) refilling {
	r := newRefilling(task.PodLauncher{VM: sandboxLauncher{sb: sb, err: err}}, &vm.Launcher{})
	r.refill = g.refill
	return r
}

// TestSettleWaitsForRefill: the server's shutdown (Settle) waits for the
// refill a launch began, so an exit right after a short task's delete does
// not cut the spares' start short; a failed launch refills nothing.
func TestSettleWaitsForRefill(t *testing.T) {
	g := &gatedRefill{release: make(chan struct{})}
	sb := &task.Sandbox{Spares: 3, SpareEnv: func(context.Context) []string { return []string{"ORDER=x"} }}
	r := newTestRefilling(sb, nil, g)
	if _, err := r.Launch(t.Context(), task.LaunchRequest{Containerd: "c.sock"}); err != nil {
		t.Fatal(err)
	}
	settled := make(chan struct{})
	go func() {
		r.Settle(context.Background())
		close(settled)
	}()
	select {
	case <-settled:
		t.Fatal("Settle returned with the refill still under way")
	case <-time.After(50 * time.Millisecond):
	}
	close(g.release)
	<-settled
	if !slices.Equal(g.got, []string{"c.sock"}) {
		t.Fatalf("refills %v, want one for c.sock", g.got)
	}

	failed := newTestRefilling(nil, errors.New("no VM"), g)
	if _, err := failed.Launch(t.Context(), task.LaunchRequest{Containerd: "other.sock"}); err == nil {
		t.Fatal("a failed launch succeeded")
	}
	failed.Settle(context.Background())
	if len(g.got) != 1 {
		t.Fatalf("refills %v after a failed launch, want none more", g.got)
	}
}

// TestSettleBoundedByContext: a refill that never ends holds the shutdown
// only until its context does.
func TestSettleBoundedByContext(t *testing.T) {
	g := &gatedRefill{release: make(chan struct{})}
	r := newTestRefilling(&task.Sandbox{}, nil, g)
	t.Cleanup(func() {
		close(g.release)
		r.Settle(context.Background()) // the refill ends with the test
	})
	if _, err := r.Launch(t.Context(), task.LaunchRequest{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	r.Settle(ctx)
	if ctx.Err() == nil {
		t.Fatal("Settle returned before its context ended, the refill still under way")
	}
}

// TestHostPauseRefillsNone: a pod sandbox's host process (no VM) starts
// no spares, which would have no order; a VM's launch does.
func TestHostPauseRefillsNone(t *testing.T) {
	for _, tc := range []struct {
		name string
		sb   *task.Sandbox
		want int
	}{
		{"a host pause", &task.Sandbox{Hypervisor: pause.Hypervisor}, 0},
		{"a VM", &task.Sandbox{Hypervisor: "qemu"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			refills := 0
			r := newRefilling(task.PodLauncher{VM: sandboxLauncher{sb: tc.sb}}, &vm.Launcher{})
			r.refill = func(string, int, ...string) error {
				refills++
				return nil
			}
			if _, err := r.Launch(t.Context(), task.LaunchRequest{}); err != nil {
				t.Fatal(err)
			}
			r.Settle(context.Background())
			if refills != tc.want {
				t.Errorf("%d refills, want %d", refills, tc.want)
			}
		})
	}
}
