// Package state is what the shim keeps in a task's bundle: the task record
// (the hypervisor process, its run directory and cgroup, the plan, the init
// exit) and the restore report (the plan and the phase timings).
//
// The task record lets `shim delete` kill the VM and clean up after the shim
// itself crashed, so it is written atomically (tmp + fsync + rename) every
// time it changes. The report only informs: it is replaced atomically, so a
// reader never sees half of one, but not synced.
package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/v2/pkg/atomicfile"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/restore"
)

const (
	// TaskFile is the task record's name inside the bundle.
	TaskFile = "cocoon-task.json"
	// ReportFile is the restore report's name inside the bundle.
	ReportFile = "cocoon-restore.json"
)

// Task is the persisted record of one task's VM.
type Task struct {
	ID         string `json:"id"`
	Hypervisor string `json:"hypervisor"`
	// PID is the hypervisor process; PIDStart its start time in clock ticks
	// since boot, so a recycled pid is never mistaken for the VM.
	PID      int    `json:"pid"`
	PIDStart uint64 `json:"pidStart"`
	// RunDir is the VM's private directory (sockets, logs).
	RunDir string `json:"runDir"`
	// StagedDir is the snapshotter's staged chain the VM was restored from.
	StagedDir string `json:"stagedDir"`
	// Cgroup is the cgroups path the hypervisor was moved into, if any.
	Cgroup string `json:"cgroup,omitempty"`
	// Network is the tap the VM's NIC uses in a namespace that outlives
	// the VM, if any.
	Network *Network `json:"network,omitempty"`
	// Base is the base snapshot staged for an ordinary image, if any.
	Base *Base `json:"base,omitempty"`
	// PoolBase is the base snapshot a pooled VM the task claimed was
	// restored from, which the server releases once the task runs:
	// named for a crash that comes first.
	PoolBase *Base `json:"poolBase,omitempty"`
	Plan     Plan  `json:"plan"`
	// Exit is the init process's exit, once known.
	Exit *Exit `json:"exit,omitempty"`
}

// Network names a VM's tap and the namespace it is in, so `shim delete`
// can remove it (and the redirects to it) after a crash.
type Network struct {
	NetNS string `json:"netns"`
	Tap   string `json:"tap"`
}

// Base names a task's base snapshot and lease in containerd, so `shim
// delete` can remove them after a crash.
type Base struct {
	Namespace   string `json:"namespace"`
	Snapshotter string `json:"snapshotter"`
	Key         string `json:"key"`
}

// Plan is the restore plan the policy chose, with its reasons.
type Plan = restore.Plan

// Phase is how long one step of the restore took.
type Phase = restore.Phase

// Exit is a process's exit status and time.
type Exit struct {
	Status uint32    `json:"status"`
	At     time.Time `json:"at"`
}

// Report is the restore report: what was restored, how, why, and how long
// each phase took.
type Report struct {
	ID         string          `json:"id"`
	Hypervisor string          `json:"hypervisor"`
	StagedDir  string          `json:"stagedDir"`
	Plan       Plan            `json:"plan"`
	Phases     []Phase         `json:"phases"`
	Total      config.Duration `json:"total"`
	CreatedAt  time.Time       `json:"createdAt"`
}

// WriteTask persists t in bundle atomically and durably.
func WriteTask(bundle string, t *Task) error {
	data, err := encode(TaskFile, t)
	if err != nil {
		return err
	}
	return writeSynced(filepath.Join(bundle, TaskFile), data)
}

// ReadTask loads the task record from bundle. A bundle without one returns
// an error matching os.ErrNotExist.
func ReadTask(bundle string) (*Task, error) {
	var t Task
	if err := readJSON(filepath.Join(bundle, TaskFile), &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// WriteReport replaces the restore report in bundle atomically. It skips
// the fsync: the report is rewritten on the task's critical path (Create,
// Start) and nothing depends on it surviving a host crash.
func WriteReport(bundle string, r *Report) error {
	data, err := encode(ReportFile, r)
	if err != nil {
		return err
	}
	return writeRenamed(filepath.Join(bundle, ReportFile), data)
}

// ReadReport loads the restore report from bundle.
func ReadReport(bundle string) (*Report, error) {
	var r Report
	if err := readJSON(filepath.Join(bundle, ReportFile), &r); err != nil {
		return nil, err
	}
	return &r, nil
}

func encode(name string, v any) ([]byte, error) {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", name, err)
	}
	return append(data, '\n'), nil
}

// writeSynced writes data to path through a synced temp file and a rename.
func writeSynced(path string, data []byte) error {
	f, err := atomicfile.New(path, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		return errors.Join(fmt.Errorf("write %s: %w", path, err), f.Cancel())
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("commit %s: %w", path, err)
	}
	return nil
}

// writeRenamed writes data to path through a temp file (mode 0600) put in
// its place atomically, without syncing.
func writeRenamed(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-")
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	_, err = f.Write(data)
	err = errors.Join(err, f.Close())
	if err == nil {
		err = replace(f.Name(), path)
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// replace puts file tmp at path. Over an existing file it exchanges the two
// and removes tmp, now the old content: ext4 makes a rename over a file
// allocate the new file's blocks first (auto_da_alloc), which costs a
// report write on the Start path 0.1-0.2 ms more here. Where there is no
// file yet, or exchange is not supported, it renames.
func replace(tmp, path string) error {
	err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, path, unix.RENAME_EXCHANGE)
	switch {
	case err == nil:
		return os.Remove(tmp)
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOSYS):
		return os.Rename(tmp, path)
	}
	return err
}

func readJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read task state: %w", err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("decode %s: %w", path, err)
	}
	return nil
}
