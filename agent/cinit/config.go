// Package cinit is the container init of a pod's VM: a small static
// binary (cmd/cocoon-cinit) the agent starts in a container's new
// namespaces to build its root and confinement and exec its process, as
// `runc init` does for runc, and that it starts again to run an exec in
// a running container. The agent resolves the spec (mount options,
// capabilities, rlimits, the seccomp program) into a Config, so the
// helper only carries it out: it imports little, and under TCG every
// instruction a VM runs for the first time is translated.
//
// The protocol, on the helper's file descriptors: the Config as JSON on
// ConfigFD; on StatusFD the helper writes Ready once the container is
// made (init only), or an error's text before it exits 1; StartFD (init
// only) gives the byte that lets the process run, and its end without one
// ends the helper. StatusFD is close-on-exec: its end after Ready, with
// nothing written, says the exec took place.
package cinit

import (
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// The helper's descriptors beside its stdio, in exec.Cmd.ExtraFiles order.
const (
	ConfigFD = 3 // the Config, read to its end
	StatusFD = 4 // Ready, or an error
	StartFD  = 5 // init: the start byte
	MountFD  = 5 // exec: the container's mount namespace
)

// Ready is what the helper writes on StatusFD once the container is made:
// a byte no error's text begins with.
const Ready = 0

// Config is what the helper does: make a container (Init) or run an
// exec in one.
type Config struct {
	// Init, the container's root and what goes in it; nil for an exec.
	Init    *Init   `json:"init,omitempty"`
	Process Process `json:"process"`
}

// Init is a container's root and namespaces' set-up, run in the new
// mount namespace before the root is pivoted into.
type Init struct {
	// Root is the container's root directory in the agent's namespace.
	Root string `json:"root"`
	// CgroupNS makes a cgroup namespace rooted at the init's cgroup.
	CgroupNS bool `json:"cgroupNS,omitempty"`
	// Propagation is the root's (MS_SLAVE|MS_REC when 0, as runc).
	Propagation uintptr       `json:"propagation,omitempty"`
	Mounts      []specs.Mount `json:"mounts,omitempty"`
	Devices     []Device      `json:"devices,omitempty"`
	// Console is the terminal's slave, bound at /dev/console.
	Console       string            `json:"console,omitempty"`
	MaskedPaths   []string          `json:"masked,omitempty"`
	ReadonlyPaths []string          `json:"readonly,omitempty"`
	ReadonlyRoot  bool              `json:"readonlyRoot,omitempty"`
	Sysctl        map[string]string `json:"sysctl,omitempty"`
	// Hostname is set when the container has a UTS namespace of its own.
	Hostname   *string `json:"hostname,omitempty"`
	Domainname *string `json:"domainname,omitempty"`
}

// Device is a device node to make in the container's /dev.
type Device struct {
	Path  string `json:"path"`
	Mode  uint32 `json:"mode"` // type and permission bits
	Major int64  `json:"major"`
	Minor int64  `json:"minor"`
	UID   uint32 `json:"uid"`
	GID   uint32 `json:"gid"`
}

// Process is the process to exec and its confinement.
type Process struct {
	Args []string `json:"args"` // Args[0] looked up in Env's PATH
	Env  []string `json:"env,omitempty"`
	Cwd  string   `json:"cwd"`

	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups,omitempty"`
	Umask  *uint32  `json:"umask,omitempty"`

	// Caps nil keeps root's; otherwise each set as the kernel's numbers.
	Caps            *Caps    `json:"caps,omitempty"`
	NoNewPrivileges bool     `json:"noNewPrivileges,omitempty"`
	Rlimits         []Rlimit `json:"rlimits,omitempty"`
	OOMScoreAdj     *int     `json:"oomScoreAdj,omitempty"`
	Seccomp         *Seccomp `json:"seccomp,omitempty"`
}

// Caps are a process's capability sets.
type Caps struct {
	Bounding    []int `json:"bounding"`
	Effective   []int `json:"effective"`
	Permitted   []int `json:"permitted"`
	Inheritable []int `json:"inheritable"`
	Ambient     []int `json:"ambient"`
}

// Rlimit is one resource's limits.
type Rlimit struct {
	Resource int    `json:"resource"`
	Soft     uint64 `json:"soft"`
	Hard     uint64 `json:"hard"`
}

// Seccomp is a compiled filter, loaded last.
type Seccomp struct {
	Program []unix.SockFilter `json:"program"`
	Flags   uintptr           `json:"flags,omitempty"`
}
