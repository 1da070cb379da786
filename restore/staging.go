package restore

import (
	"fmt"

	"github.com/cocoonstack/containerd-shim-cocoon/restore/staging"
)

// memoryStaging adds the staged memory to the plan: why it is staged so,
// and whether the driver can restore it.
func (p *Plan) memoryStaging(in Inputs) error {
	s := in.Staged
	if s == nil {
		return nil
	}
	pending := len(s.Pending())
	if pending > 0 && !staging.WritesDeltas(in.Hypervisor) {
		return fmt.Errorf("decide restore: the staged memory holds %d of the chain's %d links and %s cannot write the others into the guest; stage the whole chain",
			s.Memory.Covers, len(s.Links), in.Hypervisor)
	}
	switch {
	case pending > 0:
		p.because("memory: the staged file holds links 1-%d and the restore writes the top %d into the guest before it runs (%s)", s.Memory.Covers, pending, s.Memory.Reason)
	case s.Memory.Reason != "":
		p.because("memory: the staged file holds the whole chain (%s)", s.Memory.Reason)
	}
	return nil
}
