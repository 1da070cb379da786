package agent

import (
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// TestGuestPhases: a guest's create phases are believed only as a create
// has them (known names, once each, in order, within the call's time);
// anything else drops them whole. An Init's are checked against its own
// names (TestGuestInitPhases).
func TestGuestPhases(t *testing.T) {
	ms := func(n int64) int64 { return n * int64(time.Millisecond) }
	for _, tc := range []struct {
		name string
		in   []*api.Phase
		want int
	}{
		{"all three", []*api.Phase{{Name: api.PhaseRoot, Nanos: ms(10)}, {Name: api.PhaseBundle, Nanos: ms(1)}, {Name: api.PhaseRuncCreate, Nanos: ms(80)}}, 3},
		{"some, in order", []*api.Phase{{Name: api.PhaseRoot, Nanos: ms(10)}, {Name: api.PhaseRuncCreate, Nanos: ms(80)}}, 2},
		{"none", nil, 0},
		{"unknown name", []*api.Phase{{Name: "mine\x1b[2J", Nanos: ms(1)}}, 0},
		{"out of order", []*api.Phase{{Name: api.PhaseRuncCreate, Nanos: ms(1)}, {Name: api.PhaseRoot, Nanos: ms(1)}}, 0},
		{"twice", []*api.Phase{{Name: api.PhaseRoot, Nanos: ms(1)}, {Name: api.PhaseRoot, Nanos: ms(1)}}, 0},
		{"negative", []*api.Phase{{Name: api.PhaseRoot, Nanos: -1}}, 0},
		{"longer than the call", []*api.Phase{{Name: api.PhaseRoot, Nanos: ms(60)}, {Name: api.PhaseBundle, Nanos: ms(60)}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := guestPhases(tc.in, api.CreatePhases, 100*time.Millisecond)
			if len(got) != tc.want {
				t.Fatalf("guestPhases: %+v, want %d phases", got, tc.want)
			}
			for i, p := range got {
				if p.Name != tc.in[i].Name || p.Duration != time.Duration(tc.in[i].Nanos) {
					t.Errorf("phase %d: %+v, want %s %v", i, p, tc.in[i].Name, time.Duration(tc.in[i].Nanos))
				}
			}
		})
	}
}

// TestGuestInitPhases: an Init's phases are checked against InitPhases,
// not a create's.
func TestGuestInitPhases(t *testing.T) {
	in := []*api.Phase{{Name: api.PhaseIdentity, Nanos: 1}, {Name: api.PhaseRootfs, Nanos: 2}, {Name: api.PhaseConfine, Nanos: 3}}
	if got := guestPhases(in, api.InitPhases, time.Second); len(got) != 3 {
		t.Errorf("Init phases %+v, want all three", got)
	}
	if got := guestPhases(in, api.CreatePhases, time.Second); got != nil {
		t.Errorf("Init phases taken as a create's: %+v", got)
	}
}
