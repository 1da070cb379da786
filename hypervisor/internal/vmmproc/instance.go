package vmmproc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// Instance is a VMM process and the run directory it owns. A driver's VM
// embeds it for PID, Kill, Wait and Close.
type Instance struct {
	// RunDir is private to this VM: sockets, the log, scratch files.
	RunDir string
	proc   *Process

	closeOnce sync.Once
	closeErr  error
}

// NewInstance creates runDir (see MakeRunDir) for a VMM to be started in.
func NewInstance(runDir string) (*Instance, error) {
	if err := MakeRunDir(runDir); err != nil {
		return nil, err
	}
	return &Instance{RunDir: runDir}, nil
}

// MakeRunDir creates a VM's private run directory (0700, its parents
// 0755). It fails if dir is empty or already exists: two VMs never share
// one.
func MakeRunDir(dir string) error {
	if dir == "" {
		return errors.New("create run dir: no path given")
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("create run dir parent: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("create run dir: %w", err)
	}
	return nil
}

// Start starts the VMM in the run directory and waits for its API socket.
func (i *Instance) Start(ctx context.Context, s Spec) error {
	p, err := Start(ctx, i.RunDir, s)
	if err != nil {
		return err
	}
	i.proc = p
	return nil
}

// PID of the VMM process.
func (i *Instance) PID() int { return i.proc.PID() }

// Kill sends SIGKILL to the VMM unless it has already been reaped.
func (i *Instance) Kill() error { return i.proc.Kill() }

// Wait blocks until the VMM has exited or ctx ends; an exit other than a
// clean one is an error.
func (i *Instance) Wait(ctx context.Context) error { return i.proc.Wait(ctx) }

// Reaped blocks until the VMM has been reaped, whatever its exit status,
// or ctx ends.
func (i *Instance) Reaped(ctx context.Context) error { return i.proc.Reaped(ctx) }

// Stop kills the VMM, if one was started, and waits until it has been
// reaped.
func (i *Instance) Stop() error {
	if i.proc == nil {
		return nil
	}
	return i.proc.Stop()
}

// Close kills the VMM if it still runs, reaps it and removes the run
// directory. It is safe to call more than once, and on an instance whose
// VMM never started (a restore that failed early).
func (i *Instance) Close() error { return i.CloseWith(nil) }

// CloseWith is Close that runs release, if not nil, once the VMM is gone
// and before the run directory is removed: for what must outlive the VMM,
// such as the page-fault handler it faults against.
func (i *Instance) CloseWith(release func() error) error {
	i.closeOnce.Do(func() {
		err := i.Stop()
		if release != nil {
			err = errors.Join(err, release())
		}
		if rerr := os.RemoveAll(i.RunDir); rerr != nil {
			err = errors.Join(err, fmt.Errorf("remove run dir: %w", rerr))
		}
		i.closeErr = err
	})
	return i.closeErr
}
