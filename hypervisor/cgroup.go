package hypervisor

import "syscall"

// Cgroup is the VM's cgroup, made before its restore, so that the guest
// memory a driver makes and the hypervisor process it starts are charged
// to the VM from their first page and first instruction (cgroup v1 never
// moves charges made elsewhere, and v2 moves none either).
type Cgroup interface {
	// Charge runs fill with the calling process in the cgroup: the memory
	// fill allocates for the guest (a copy restore's memfd) is the VM's.
	// No other process is started while fill runs.
	Charge(fill func() error) error
	// Start runs start, which forks the hypervisor with attr on the
	// calling OS thread, so that the hypervisor is born in the cgroup.
	Start(attr *syscall.SysProcAttr, start func() error) error
}

// Charge runs fill in r.Cgroup (see Cgroup.Charge), or as it is without one.
func (r RestoreRequest) Charge(fill func() error) error {
	if r.Cgroup == nil {
		return fill()
	}
	return r.Cgroup.Charge(fill)
}

// BornIn is the hook that forks the hypervisor in r.Cgroup (see
// Cgroup.Start); nil without one.
func (r RestoreRequest) BornIn() func(attr *syscall.SysProcAttr, start func() error) error {
	if r.Cgroup == nil {
		return nil
	}
	return r.Cgroup.Start
}
