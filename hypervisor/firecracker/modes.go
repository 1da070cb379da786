package firecracker

import "github.com/cocoonstack/containerd-shim-cocoon/hypervisor"

// restoreModes are the modes this driver restores in, best first.
var restoreModes = []hypervisor.Mode{hypervisor.ModeMmap, hypervisor.ModeCopy}
