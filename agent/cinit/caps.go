package cinit

import (
	"strings"
	"sync"

	"github.com/moby/sys/capability"
)

// supportedCaps are the capabilities the running kernel knows, by the
// name the OCI spec gives them ("CAP_NET_ADMIN").
var supportedCaps = sync.OnceValue(func() map[string]capability.Cap {
	caps, err := capability.ListSupported()
	if err != nil {
		caps = capability.ListKnown()
	}
	byName := make(map[string]capability.Cap, len(caps))
	for _, c := range caps {
		byName["CAP_"+strings.ToUpper(c.String())] = c
	}
	return byName
})

// Capability is the capability an OCI name ("CAP_NET_ADMIN") gives, and
// whether the running kernel knows it.
func Capability(name string) (capability.Cap, bool) {
	c, ok := supportedCaps()[name]
	return c, ok
}

// KnownCapabilities is how many capabilities the running kernel knows.
func KnownCapabilities() int { return len(supportedCaps()) }
