package server

import (
	"fmt"

	"github.com/containerd/errdefs"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/cinit"
)

// rlimit is a checked api.Rlimit.
type rlimit struct {
	Name       string
	Resource   int
	Soft, Hard uint64
}

func parseRlimits(in []*api.Rlimit) ([]rlimit, error) {
	var out []rlimit
	seen := map[string]bool{}
	for _, l := range in {
		res, ok := cinit.RlimitResource(l.Type)
		switch {
		case !ok:
			return nil, fmt.Errorf("rlimit %q: expected an OCI name such as RLIMIT_NOFILE: %w", l.Type, errdefs.ErrInvalidArgument)
		case seen[l.Type]:
			return nil, fmt.Errorf("rlimit %s given twice: %w", l.Type, errdefs.ErrInvalidArgument)
		case l.Soft > l.Hard:
			return nil, fmt.Errorf("rlimit %s: soft %d above hard %d: %w", l.Type, l.Soft, l.Hard, errdefs.ErrInvalidArgument)
		}
		seen[l.Type] = true
		out = append(out, rlimit{Name: l.Type, Resource: res, Soft: l.Soft, Hard: l.Hard})
	}
	return out, nil
}
