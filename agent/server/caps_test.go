package server

import (
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/moby/sys/capability"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

func TestNewCapSet(t *testing.T) {
	supported, err := capability.ListSupported()
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	for _, c := range supported {
		all = append(all, "CAP_"+strings.ToUpper(c.String()))
	}
	for _, tc := range []struct {
		name    string
		in      *api.Capabilities
		nilSet  bool
		bound   []capability.Cap
		ambient []uintptr
	}{
		{"none given", nil, true, nil, nil},
		{"all", &api.Capabilities{Bounding: all, Effective: all, Permitted: all}, true, nil, nil},
		{"dropped all", &api.Capabilities{}, false, nil, nil},
		{"default-like", &api.Capabilities{Bounding: []string{"CAP_CHOWN", "CAP_KILL", "CAP_NET_BIND_SERVICE"}}, false,
			[]capability.Cap{capability.CAP_CHOWN, capability.CAP_KILL, capability.CAP_NET_BIND_SERVICE}, nil},
		{"ambient", &api.Capabilities{Bounding: []string{"CAP_NET_ADMIN"}, Ambient: []string{"CAP_NET_ADMIN"}}, false,
			[]capability.Cap{capability.CAP_NET_ADMIN}, []uintptr{uintptr(capability.CAP_NET_ADMIN)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := newCapSet(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if (s == nil) != tc.nilSet {
				t.Fatalf("set %+v, want nil: %v", s, tc.nilSet)
			}
			if s != nil && (!slices.Equal(s.bounding, tc.bound) || !slices.Equal(s.ambient, tc.ambient)) {
				t.Fatalf("bounding %v ambient %v, want %v %v", s.bounding, s.ambient, tc.bound, tc.ambient)
			}
		})
	}
	if _, err := newCapSet(&api.Capabilities{Bounding: []string{"CAP_FLY"}}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("an unknown capability: %v, want InvalidArgument", err)
	}
}
