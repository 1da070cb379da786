package server

import (
	"slices"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

func TestNewCapSet(t *testing.T) {
	all := capNames[:lastCap()+1]
	for _, tc := range []struct {
		name    string
		in      *api.Capabilities
		nilSet  bool
		bound   uint64
		ambient []uintptr
	}{
		{"none given", nil, true, 0, nil},
		{"all", &api.Capabilities{Bounding: all, Effective: all, Permitted: all}, true, 0, nil},
		{"dropped all", &api.Capabilities{}, false, 0, nil},
		{"default-like", &api.Capabilities{Bounding: []string{"CAP_CHOWN", "CAP_KILL", "CAP_NET_BIND_SERVICE"}}, false, 1<<0 | 1<<5 | 1<<10, nil},
		{"ambient", &api.Capabilities{Bounding: []string{"CAP_NET_ADMIN"}, Ambient: []string{"CAP_NET_ADMIN"}}, false, 1 << 12, []uintptr{12}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := newCapSet(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if (s == nil) != tc.nilSet {
				t.Fatalf("set %+v, want nil: %v", s, tc.nilSet)
			}
			if s != nil && (s.bounding != tc.bound || !slices.Equal(s.ambientList(), tc.ambient)) {
				t.Fatalf("bounding %#x ambient %v, want %#x %v", s.bounding, s.ambientList(), tc.bound, tc.ambient)
			}
		})
	}
	if _, err := newCapSet(&api.Capabilities{Bounding: []string{"CAP_FLY"}}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("an unknown capability: %v, want InvalidArgument", err)
	}
}
