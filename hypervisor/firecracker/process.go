package firecracker

import "time"

// Files in a VM's run directory.
const (
	apiSock   = "api.sock"
	vsockSock = "vsock.sock"
	uffdSock  = "uffd.sock"
	memCopy   = "memory"
	vmmLog    = "firecracker.log"
)

// callTimeout bounds an API call whose context has no deadline of its own:
// a hypervisor that never answers a request must not hang the caller.
const callTimeout = 2 * time.Minute
