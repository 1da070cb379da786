package server

import (
	"fmt"

	"github.com/containerd/errdefs"
	"github.com/moby/sys/capability"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/cinit"
)

// capSet is what a process's capabilities ask of the thread that forks it.
type capSet struct {
	bounding, inheritable []capability.Cap
	ambient               []uintptr // as Go's SysProcAttr takes them
}

// newCapSet reads c, refusing a name the guest's kernel does not know. It
// is nil, the process keeping what the agent has, for nil c and for every
// capability bounded with none inheritable or ambient.
func newCapSet(c *api.Capabilities) (*capSet, error) {
	if c == nil {
		return nil, nil
	}
	var s capSet
	var err error
	if s.bounding, err = capsNamed(c.Bounding); err != nil {
		return nil, err
	}
	if s.inheritable, err = capsNamed(append(c.Inheritable, c.Ambient...)); err != nil {
		return nil, err
	}
	ambient, err := capsNamed(c.Ambient)
	if err != nil {
		return nil, err
	}
	for _, a := range ambient {
		s.ambient = append(s.ambient, uintptr(a))
	}
	if len(s.bounding) == cinit.KnownCapabilities() && len(s.inheritable) == 0 {
		return nil, nil
	}
	return &s, nil
}

// capsNamed is names as capabilities, each once.
func capsNamed(names []string) ([]capability.Cap, error) {
	var caps []capability.Cap
	seen := map[capability.Cap]bool{}
	for _, name := range names {
		c, ok := cinit.Capability(name)
		if !ok {
			return nil, fmt.Errorf("capability %q: the guest's kernel does not know it: %w", name, errdefs.ErrInvalidArgument)
		}
		if !seen[c] {
			seen[c] = true
			caps = append(caps, c)
		}
	}
	return caps, nil
}

// take gives this thread the set, for the process it forks next: its
// bounding set (which, for a process that stays root, is what it gets at
// exec) and inheritable set, with the ambient ones among them (Go raises
// those in the child). Its own effective set, which the fork's setuid and
// chroot need, stays.
func (s *capSet) take() error {
	caps, err := capability.NewPid2(0)
	if err == nil {
		err = caps.Load()
	}
	if err != nil {
		return fmt.Errorf("read capabilities: %w", err)
	}
	caps.Clear(capability.BOUNDS)
	caps.Set(capability.BOUNDING, s.bounding...)
	caps.Unset(capability.INHERITABLE, capability.ListKnown()...)
	caps.Set(capability.INHERITABLE, s.inheritable...)
	if err := caps.Apply(capability.BOUNDS | capability.CAPS); err != nil {
		return fmt.Errorf("set capabilities: %w", err)
	}
	return nil
}
