package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// A fill yields to launches: a launch (with shim.pooled_vm on) holds a
// shared flock on shim.run_dir while it creates its VM, and a fill stages
// and restores only once it can take that flock exclusively, and lets go
// of it at once. Right after a burst, its tasks' servers start a spare for
// every slot; were those fills to restore while the next burst's launches
// restore their own VMs (the spares, not restored yet, having nothing to
// give them), all would share the CPUs, and the burst would start slower
// than with no pool at all. A launch never waits for a fill: a fill checks
// in an instant, and one restoring already is one a launch may claim.

// holdLaunch marks a launch under way in runDir (created if need be)
// until the returned func runs.
func holdLaunch(runDir string) (func(), error) {
	if err := os.MkdirAll(runDir, 0o711); err != nil {
		return nil, fmt.Errorf("create run dir: %w", err)
	}
	fd, err := openDir(runDir)
	if err != nil {
		return nil, err
	}
	for {
		err = unix.Flock(fd, unix.LOCK_SH)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("lock %s shared: %w", runDir, err)
	}
	return func() { unix.Close(fd) }, nil
}

// awaitLaunches waits, until ctx ends, for a moment when no launch is
// under way in runDir.
func awaitLaunches(ctx context.Context, runDir string) error {
	unlock, err := pollFlock(ctx, runDir)
	if err != nil {
		return err
	}
	unlock()
	return nil
}

// flockPoll is how often a fill waiting for a flock tries again.
const flockPoll = 20 * time.Millisecond

// pollFlock takes an exclusive flock on dir, trying every flockPoll until
// ctx ends (a fill's cancel ends the wait), and returns the unlock.
func pollFlock(ctx context.Context, dir string) (func(), error) {
	fd, err := openDir(dir)
	if err != nil {
		return nil, err
	}
	for {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { unix.Close(fd) }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			unix.Close(fd)
			return nil, fmt.Errorf("lock %s: %w", dir, err)
		}
		select {
		case <-ctx.Done():
			unix.Close(fd)
			return nil, ctx.Err()
		case <-time.After(flockPoll):
		}
	}
}

// openDir opens dir for a flock on it.
func openDir(dir string) (int, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", dir, err)
	}
	return fd, nil
}
