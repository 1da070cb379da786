package apifake

import (
	"fmt"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/firecracker/uffd/uffdpeer"
)

// uffdMemory plays Firecracker's Uffd backend: size bytes of anonymous
// guest memory registered with a userfaultfd, which goes to the handler
// listening on sock with the region list, as Firecracker sends it. Every
// page the fake later reads is then a fault the handler must serve.
func uffdMemory(sock string, size int) (*guestMemory, error) {
	p, err := uffdpeer.New(size, uffdpeer.FeatureEventRemove)
	if err != nil {
		return nil, err
	}
	if err := p.Send(sock, p.Mapping(0, uint64(size), 0)); err != nil {
		p.Close()
		return nil, fmt.Errorf("hand guest memory to the uffd handler: %w", err)
	}
	p.CloseUFFD()
	return &guestMemory{anon: p}, nil
}
