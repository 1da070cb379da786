package api

// The steps of a CreateContainer the guest times, in the order
// ContainerProcessResponse.phases has them: the container's bundle dir
// made and its root ready (a disk found, probed, mounted under its
// overlay), its files and config.json written, and runc's create (its
// init then waits for the start).
const (
	PhaseRoot       = "root"
	PhaseBundle     = "bundle"
	PhaseRuncCreate = "runc create"
)

// CreatePhases are those names in order.
var CreatePhases = []string{PhaseRoot, PhaseBundle, PhaseRuncCreate}
