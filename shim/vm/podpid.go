package vm

import (
	"context"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
)

// pauseGuest is the guest of a pod's VM under containerd's default
// sandboxer: when the sandbox's process (the pod's pause) starts in a PID
// namespace of its own, that namespace is the pod's shared one, and the
// pod's containers that share it join it, so that the pause is their pid
// 1 as under runc.
type pauseGuest struct {
	task.Guest
	pod *pod
}

func (g pauseGuest) Exec(ctx context.Context, p task.ProcessSpec) (task.Started, error) {
	s, err := g.Guest.Exec(ctx, p)
	if err == nil && p.ID == task.InitGuestID && p.OwnPIDNamespace {
		g.pod.holdPIDs(s.Pid)
	}
	return s, err
}
