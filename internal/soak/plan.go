package soak

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// ImageKind is what a restore's container image is.
type ImageKind string

const (
	// ImageChain is the snapshot image: its layers are the chain.
	ImageChain ImageKind = "chain"
	// ImageOrdinary is the busybox image, run in a VM restored from the
	// config's [restore] base_image.
	ImageOrdinary ImageKind = "ordinary"
)

// NetKind is the network a restore's task gets.
type NetKind string

const (
	// NetHost shares the runtime's network namespace: no tap.
	NetHost NetKind = "host"
	// NetNew is ctr's default: the spec asks for a new namespace, which
	// the shim makes; nothing in it to take over.
	NetNew NetKind = "new"
	// NetPair is a namespace the soak made with a veth to a peer namespace
	// it also made: the guest takes the veth over and pings the peer.
	NetPair NetKind = "veth"
)

// KillKind is what a deliberate kill hits.
type KillKind string

const (
	// KillTask is SIGKILL of the task through containerd.
	KillTask KillKind = "task"
	// KillShim is SIGKILL of the shim's task server by its pid.
	KillShim KillKind = "shim"
	// KillQEMU is SIGKILL of the hypervisor by its pid.
	KillQEMU KillKind = "qemu"
)

// KillPoint is when in a task's life the kill comes.
type KillPoint string

const (
	// DuringCreate kills while the task is being created (the VM being
	// restored), or as soon as it can be hit.
	DuringCreate KillPoint = "create"
	// AfterStart kills once the init process runs.
	AfterStart KillPoint = "started"
	// DuringExec kills while an exec'd process runs.
	DuringExec KillPoint = "exec"
)

var (
	killKinds  = []KillKind{KillTask, KillShim, KillQEMU}
	killPoints = []KillPoint{DuringCreate, AfterStart, DuringExec}
)

// Kill is a deliberate kill of one restore.
type Kill struct {
	Kind  KillKind
	Point KillPoint
	// Delay is how long after the point's start the kill comes.
	Delay time.Duration
}

// Plan is what one restore does.
type Plan struct {
	Index int
	ID    string
	Mode  hypervisor.Mode
	Image ImageKind
	Net   NetKind
	// Exec runs a process beside init, checking its output.
	Exec bool
	// SelfExit makes init exit on its own with exitCode; otherwise the
	// soak stops it with SIGTERM. Never with Exec.
	SelfExit bool
	// Kill, when set, is the deliberate kill; the restore may then fail.
	Kill *Kill
	// Hostile, when set, is a hostile input the restore is given.
	Hostile Hostile
	// Pod makes it a pod (podRun): its sandbox and containers, in one VM.
	Pod bool
}

// exitCode is what a self-exiting init exits with.
const exitCode = 7

func (p Plan) String() string {
	if p.Pod {
		return fmt.Sprintf("%s (pod: %s, a sandbox and %d containers in one VM, one replaced)", p.ID, p.Mode, podMembers)
	}
	s := fmt.Sprintf("%s (%s, %s image, %s network", p.ID, p.Mode, p.Image, p.Net)
	if p.Kill != nil {
		s += fmt.Sprintf(", kill %s %s +%s", p.Kill.Kind, p.Kill.Point, p.Kill.Delay)
	}
	if p.Hostile != "" {
		s += ", hostile " + string(p.Hostile)
	}
	return s + ")"
}

// makePlans lays out n restores from seed: modes alternate, a half runs
// without a network namespace and the rest split between a veth pair and a
// new namespace, ordinaryShare of them use the ordinary image, and
// round(n*killRate) of them are killed, cycling through every kind and
// point, and round(n*hostileShare) of the others get a hostile input,
// cycling through the kinds. Each property is shuffled on its own, so the
// mixes cross.
func makePlans(prefix string, n int, killRate, ordinaryShare, hostileShare float64, seed uint64) []Plan {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	plans := make([]Plan, n)
	modes := spread(rng, n, []hypervisor.Mode{hypervisor.ModeCopy, hypervisor.ModeMmap})
	nets := spread(rng, n, []NetKind{NetHost, NetHost, NetNew, NetPair})
	ordinary := int(float64(n)*ordinaryShare + 0.5)
	kills := int(float64(n)*killRate + 0.5)
	images, killed := rng.Perm(n), rng.Perm(n)
	for i := range plans {
		plans[i] = Plan{
			Index: i, ID: fmt.Sprintf("%s-%04d", prefix, i),
			Mode: modes[i], Image: ImageChain, Net: nets[i],
			Exec: rng.IntN(3) == 0, SelfExit: rng.IntN(2) == 0,
		}
		// An exec needs init alive beside it.
		plans[i].SelfExit = plans[i].SelfExit && !plans[i].Exec
	}
	for _, i := range images[:ordinary] {
		plans[i].Image = ImageOrdinary
	}
	for k, i := range killed[:kills] {
		combo := k % (len(killKinds) * len(killPoints))
		plans[i].Kill = &Kill{
			Kind:  killKinds[combo%len(killKinds)],
			Point: killPoints[combo/len(killKinds)],
			Delay: time.Duration(rng.IntN(1500)) * time.Millisecond,
		}
		// A kill after start aims at a running init, an exec kill at
		// one beside it.
		switch plans[i].Kill.Point {
		case AfterStart:
			plans[i].SelfExit = false
		case DuringExec:
			plans[i].Exec, plans[i].SelfExit = true, false
		}
	}
	addHostile(plans, killed[kills:], int(float64(n)*hostileShare+0.5))
	return plans
}

// withPods spreads count pod plans evenly among plans, modes alternating.
func withPods(plans []Plan, prefix string, count int) []Plan {
	n := len(plans)
	out := make([]Plan, 0, n+count)
	for k := range count {
		pod := Plan{Index: n + k, ID: fmt.Sprintf("%s-pod%02d", prefix, k), Mode: []hypervisor.Mode{hypervisor.ModeMmap, hypervisor.ModeCopy}[k%2],
			Image: ImageOrdinary, Net: NetNew, Pod: true}
		at := (k + 1) * n / (count + 1)
		out = append(append(out, plans[len(out)-k:at]...), pod)
	}
	return append(out, plans[len(out)-count:]...)
}

// addHostile gives count of the plans, taken in order, a hostile input
// each, cycling through the kinds; one needing mounts goes to a plan of the
// ordinary image, and a kind no plan is left for is dropped from the cycle.
func addHostile(plans []Plan, order []int, count int) {
	kinds := slices.Clone(hostileKinds)
	for k := 0; count > 0 && len(kinds) > 0; k++ {
		h := kinds[k%len(kinds)]
		at := slices.IndexFunc(order, func(i int) bool {
			return plans[i].Hostile == "" && (!h.needsMounts() || plans[i].Image == ImageOrdinary)
		})
		if at < 0 {
			kinds = slices.DeleteFunc(kinds, func(x Hostile) bool { return x == h })
			continue
		}
		i := order[at]
		plans[i].Hostile = h
		// A refused create runs nothing; the others' init prints what it
		// found, which an exec beside it would not change.
		plans[i].Exec = false
		count--
	}
}

// spread returns n values cycling through vals, shuffled.
func spread[T any](rng *rand.Rand, n int, vals []T) []T {
	out := make([]T, n)
	for i := range out {
		out[i] = vals[i%len(vals)]
	}
	rng.Shuffle(n, func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}
