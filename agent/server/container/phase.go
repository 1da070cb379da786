package container

import "time"

// Phase is how long one step of a create took.
type Phase struct {
	Name     string
	Duration time.Duration
}

// clock times a create's steps one after another.
type clock struct {
	last   time.Time
	phases []Phase
}

func newClock() *clock { return &clock{last: time.Now()} }

func (c *clock) lap(name string) {
	now := time.Now()
	c.phases = append(c.phases, Phase{Name: name, Duration: now.Sub(c.last)})
	c.last = now
}
