package api

import "time"

// The steps of a CreateContainer the guest times, in the order
// ContainerProcessResponse.phases has them: the container's bundle dir
// made and its root's disk found (probed again: PhaseDisk, below; none
// for a root that is a directory), its root ready (the disk mounted under
// its overlay), its files and config.json written, and runc's create (its
// init then waits for the start).
const (
	PhaseRoot       = "root"
	PhaseBundle     = "bundle"
	PhaseRuncCreate = "runc create"
	PhaseInitCreate = "init create" // the agent's own container init's
)

// CreatePhases are those names in order.
var CreatePhases = []string{PhaseDisk, PhaseRoot, PhaseBundle, PhaseRuncCreate, PhaseInitCreate}

// The steps of an Init the guest times, in the order
// InitResponse.phases has them; a step with nothing to do is left out.
// identity is the clock, the randomness and the hostname; disk the root's
// disk found (its virtio device bound, its node there); rootfs its root
// and the container's mounts mounted; confine the
// masked and read-only paths and the read-only root applied over them;
// process the process forked and exec'd, held for Start, with its user,
// capabilities, no_new_privs, umask and rlimits.
const (
	PhaseIdentity = "identity"
	PhaseSysctls  = "sysctls"
	PhaseFiles    = "files"
	PhaseNetwork  = "network"
	PhaseDisk     = "disk"
	PhaseRootfs   = "rootfs"
	PhaseConfine  = "confine"
	PhaseProcess  = "process"
)

// InitPhases are those names in order.
var InitPhases = []string{PhaseIdentity, PhaseSysctls, PhaseFiles, PhaseNetwork, PhaseDisk, PhaseRootfs, PhaseConfine, PhaseProcess}

// Clock times a call's steps one after another, as the API reports them.
type Clock struct {
	last   time.Time
	phases []*Phase
}

// NewClock starts timing the first step.
func NewClock() *Clock { return &Clock{last: time.Now()} }

// Lap ends the step under way as name and starts the next.
func (c *Clock) Lap(name string) {
	now := time.Now()
	c.phases = append(c.phases, &Phase{Name: name, Nanos: now.Sub(c.last).Nanoseconds()})
	c.last = now
}

// Skip starts the next step, leaving the one under way out.
func (c *Clock) Skip() { c.last = time.Now() }

// Phases are the steps lapped so far.
func (c *Clock) Phases() []*Phase { return c.phases }
