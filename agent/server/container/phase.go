package container

import (
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// clock times a create's steps one after another, as the API reports them.
type clock struct {
	last   time.Time
	phases []*api.Phase
}

func newClock() *clock { return &clock{last: time.Now()} }

func (c *clock) lap(name string) {
	now := time.Now()
	c.phases = append(c.phases, &api.Phase{Name: name, Nanos: now.Sub(c.last).Nanoseconds()})
	c.last = now
}
