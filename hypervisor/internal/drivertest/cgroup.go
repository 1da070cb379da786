package drivertest

import (
	"sync/atomic"
	"syscall"
)

// Cgroup is a hypervisor.Cgroup that counts what a driver ran through it:
// the fills it charged and the processes it started.
type Cgroup struct {
	Charges, Starts atomic.Int32
}

func (c *Cgroup) Charge(fill func() error) error {
	c.Charges.Add(1)
	return fill()
}

func (c *Cgroup) Start(_ *syscall.SysProcAttr, start func() error) error {
	c.Starts.Add(1)
	return start()
}
