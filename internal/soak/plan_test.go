package soak

import (
	"reflect"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// TestMakePlans: the mix is exact (modes, networks, ordinary share, kills
// cycling through every kind and point, hostile inputs through theirs),
// ids are unique, an exec never goes with a self-exiting init nor with a
// hostile input, a hostile input needing mounts goes to the ordinary image
// and never to a killed restore, and a seed lays out the same plans.
func TestMakePlans(t *testing.T) {
	const n = 1000
	plans := makePlans("r", n, 0.1, 0.25, 0.05, 42)
	counts := map[string]int{}
	ids := map[string]bool{}
	for _, p := range plans {
		counts[string(p.Mode)]++
		counts["net "+string(p.Net)]++
		counts["image "+string(p.Image)]++
		if ids[p.ID] {
			t.Fatalf("id %s twice", p.ID)
		}
		ids[p.ID] = true
		if p.Exec && p.SelfExit {
			t.Fatalf("plan %s execs beside an init that exits on its own", p)
		}
		if h := p.Hostile; h != "" {
			counts["hostile "+string(h)]++
			if p.Kill != nil || p.Exec || (h.needsMounts() && p.Image != ImageOrdinary) {
				t.Fatalf("plan %s: a hostile input with a kill, an exec or mounts on a snapshot image", p)
			}
		}
		if k := p.Kill; k != nil {
			counts["kill "+string(k.Kind)+" "+string(k.Point)]++
			if k.Point == DuringExec && !p.Exec {
				t.Fatalf("plan %s kills during an exec it does not run", p)
			}
			if k.Point != DuringCreate && p.SelfExit {
				t.Fatalf("plan %s kills after start an init that exits on its own", p)
			}
		}
	}
	want := map[string]int{
		string(hypervisor.ModeCopy): 500, string(hypervisor.ModeMmap): 500,
		"net host": 500, "net new": 250, "net veth": 250,
		"image ordinary": 250, "image chain": 750,
	}
	for _, h := range hostileKinds {
		want["hostile "+string(h)] = 10
	}
	for _, k := range killKinds {
		for _, p := range killPoints {
			// 100 kills over 9 combinations: 11 or 12 each.
			if c := counts["kill "+string(k)+" "+string(p)]; c != 11 && c != 12 {
				t.Errorf("%d kills of %s %s, want 11 or 12", c, k, p)
			}
		}
	}
	for k, v := range want {
		if counts[k] != v {
			t.Errorf("%d plans %s, want %d", counts[k], k, v)
		}
	}
	again := makePlans("r", n, 0.1, 0.25, 0.05, 42)
	for i := range plans {
		if plans[i].String() != again[i].String() || plans[i].Exec != again[i].Exec {
			t.Fatalf("seed 42 laid out %s, then %s", plans[i], again[i])
		}
	}
}

// TestMakePlansHostileWithoutOrdinary: with no ordinary image, the hostile
// share goes to the one kind a snapshot image takes.
func TestMakePlansHostileWithoutOrdinary(t *testing.T) {
	n := 0
	for _, p := range makePlans("r", 100, 0, 0, 0.1, 7) {
		switch p.Hostile {
		case "":
		case HostileFIFONetns:
			n++
		default:
			t.Fatalf("plan %s: a hostile input needing mounts without an ordinary image", p)
		}
	}
	if n != 10 {
		t.Fatalf("%d plans with a FIFO as their namespace, want 10", n)
	}
}

// TestWithPods: pods are spread among the plans, which keep their order,
// with ids and indexes of their own.
func TestWithPods(t *testing.T) {
	plans := makePlans("r", 10, 0, 0, 0, 1)
	out := withPods(plans, "r", 3)
	var kept []Plan
	ids := map[string]bool{}
	var at []int
	for i, p := range out {
		if ids[p.ID] {
			t.Fatalf("id %s twice", p.ID)
		}
		ids[p.ID] = true
		if p.Pod {
			at = append(at, i)
			if p.Index < 10 || p.Image != ImageOrdinary {
				t.Errorf("pod plan %s: index %d, image %s; want an index after the restores' and the ordinary image", p, p.Index, p.Image)
			}
			continue
		}
		kept = append(kept, p)
	}
	if len(at) != 3 || at[0] == 0 || at[2] == len(out)-1 || !reflect.DeepEqual(kept, plans) {
		t.Fatalf("pods at %v of %d plans, the rest %v; want 3 pods among the plans, which keep their order", at, len(out), kept)
	}
}
