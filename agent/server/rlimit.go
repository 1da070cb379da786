package server

import (
	"fmt"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// rlimitTypes are the resources OCI names (runtime-spec config.md).
var rlimitTypes = map[string]int{
	"RLIMIT_AS": unix.RLIMIT_AS, "RLIMIT_CORE": unix.RLIMIT_CORE, "RLIMIT_CPU": unix.RLIMIT_CPU,
	"RLIMIT_DATA": unix.RLIMIT_DATA, "RLIMIT_FSIZE": unix.RLIMIT_FSIZE, "RLIMIT_LOCKS": unix.RLIMIT_LOCKS,
	"RLIMIT_MEMLOCK": unix.RLIMIT_MEMLOCK, "RLIMIT_MSGQUEUE": unix.RLIMIT_MSGQUEUE, "RLIMIT_NICE": unix.RLIMIT_NICE,
	"RLIMIT_NOFILE": unix.RLIMIT_NOFILE, "RLIMIT_NPROC": unix.RLIMIT_NPROC, "RLIMIT_RSS": unix.RLIMIT_RSS,
	"RLIMIT_RTPRIO": unix.RLIMIT_RTPRIO, "RLIMIT_RTTIME": unix.RLIMIT_RTTIME,
	"RLIMIT_SIGPENDING": unix.RLIMIT_SIGPENDING, "RLIMIT_STACK": unix.RLIMIT_STACK,
}

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
		res, ok := rlimitTypes[l.Type]
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
