package task

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"

	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	"golang.org/x/sys/unix"
)

// The shim makes a copy restore's guest memory itself, and a page is
// charged to the memory cgroup its maker is in when it is allocated: the
// shim enters the VM's memory cgroup for the fill and leaves it after.
// Membership is the whole process's, so the fill holds syscall.ForkLock:
// no other goroutine starts a process (a hook, a spare server) that would
// be born in the VM's cgroup, and two fills do not interleave. The cgroup
// has no limits yet (vmSetup sets them once the hypervisor runs), so the
// shim is never the OOM killer's candidate there.
//
// The hypervisor is forked into the cgroup instead of moved after its
// start: under v1 by the forking thread alone entering it (a child is born
// in its parent thread's cgroups), under v2 with CLONE_INTO_CGROUP.

// Charge runs fill with the shim in the VM's memory cgroup.
func (c cgroupV1) Charge(fill func() error) error {
	syscall.ForkLock.Lock()
	defer syscall.ForkLock.Unlock()
	pid := os.Getpid()
	own, err := cgroup1.Load(cgroup1.PidPath(pid))
	if err != nil {
		return fmt.Errorf("load the shim's cgroups: %w", err)
	}
	if err := c.cg.AddProc(uint64(pid), cgroup1.Memory); err != nil {
		return fmt.Errorf("enter the VM's memory cgroup: %w", err)
	}
	ferr := fill()
	if err := own.AddProc(uint64(pid), cgroup1.Memory); err != nil {
		return errors.Join(ferr, fmt.Errorf("return to the shim's memory cgroup: %w", err))
	}
	return ferr
}

// Start runs start on a thread of the shim that is in the VM's cgroups
// meanwhile.
func (c cgroupV1) Start(_ *syscall.SysProcAttr, start func() error) error {
	runtime.LockOSThread()
	own, err := cgroup1.Load(cgroup1.PidPath(os.Getpid()))
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("load the shim's cgroups: %w", err)
	}
	thread := cgroup1.Process{Pid: unix.Gettid()}
	serr := c.cg.AddTask(thread)
	if serr == nil {
		serr = start()
	} else {
		serr = fmt.Errorf("enter the VM's cgroups: %w", serr)
	}
	if err := own.AddTask(thread); err != nil {
		// The thread stays locked to this goroutine, so no other
		// goroutine's process is born in the VM's cgroups from it.
		return errors.Join(serr, fmt.Errorf("return to the shim's cgroups: %w", err))
	}
	runtime.UnlockOSThread()
	return serr
}

// Charge runs fill with the shim in the VM's cgroup.
func (c cgroupV2) Charge(fill func() error) error {
	syscall.ForkLock.Lock()
	defer syscall.ForkLock.Unlock()
	pid := os.Getpid()
	path, err := cgroup2.PidGroupPath(pid)
	if err != nil {
		return fmt.Errorf("find the shim's cgroup: %w", err)
	}
	own, err := cgroup2.Load(path)
	if err != nil {
		return fmt.Errorf("load the shim's cgroup %s: %w", path, err)
	}
	if err := c.m.AddProc(uint64(pid)); err != nil {
		return fmt.Errorf("enter the VM's cgroup: %w", err)
	}
	ferr := fill()
	if err := own.AddProc(uint64(pid)); err != nil {
		return errors.Join(ferr, fmt.Errorf("return to the shim's cgroup %s: %w", path, err))
	}
	return ferr
}

// Start runs start with attr asking for the child to be born in the VM's
// cgroup (clone3 CLONE_INTO_CGROUP).
func (c cgroupV2) Start(attr *syscall.SysProcAttr, start func() error) error {
	if attr == nil {
		return errors.New("start in the VM's cgroup: no process attributes to set CLONE_INTO_CGROUP in")
	}
	dir, err := os.Open(c.dir)
	if err != nil {
		return fmt.Errorf("open the VM's cgroup: %w", err)
	}
	defer dir.Close()
	attr.UseCgroupFD, attr.CgroupFD = true, int(dir.Fd())
	return start()
}
