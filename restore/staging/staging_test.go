package staging

import (
	"strings"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

func linuxLink(hv string) *chain.Link {
	return &chain.Link{Hypervisor: hv, GuestOS: "linux", MemoryBytes: 512 << 20, PageSize: 4096}
}

// testChain is a chain of hv links of 512 MiB memory whose diffs carry
// delta bytes each.
func testChain(hv string, n int, delta int64) []*chain.Link {
	links := make([]*chain.Link, n)
	for i := range links {
		links[i] = linuxLink(hv)
		links[i].Memory.DataBytes = delta
	}
	links[0].Memory.DataBytes = 100 << 20
	return links
}

func TestMemory(t *testing.T) {
	tests := []struct {
		name   string
		links  []*chain.Link
		cached []int // links whose chain's flat file is on the node
		covers int
		reason string
	}{
		{"top cached", testChain("qemu", 3, 8<<20), []int{0, 2}, 3, "cached on this node"},
		{"one link", testChain("qemu", 1, 0), nil, 1, "flattened on this node first"},
		{"parent cached", testChain("qemu", 3, 8<<20), []int{1}, 2, "links 1-2 are flattened on this node: the restore writes the top 1 link(s), 8MiB"},
		{"longest prefix wins", testChain("qemu", 4, 8<<20), []int{0, 2}, 3, "links 1-3 are flattened"},
		{"base cached", testChain("qemu", 3, 8<<20), []int{0}, 1, "top 2 link(s), 16MiB"},
		{"nothing cached", testChain("qemu", 3, 8<<20), nil, 3, "no prefix of the chain is flattened"},
		{"delta too big", testChain("qemu", 2, 200<<20), []int{0}, 2, "over 1/4 of the 512MiB memory"},
		{"hypervisor reads one file", testChain("cloud-hypervisor", 2, 8<<20), []int{0}, 2, "cloud-hypervisor restores guest memory only from one file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cached := func(i int) bool {
				for _, c := range tt.cached {
					if c == i {
						return true
					}
				}
				return false
			}
			m := Memory(tt.links, cached)
			if m.Covers != tt.covers || !strings.Contains(m.Reason, tt.reason) {
				t.Fatalf("got covers %d (%q), want %d and a reason containing %q", m.Covers, m.Reason, tt.covers, tt.reason)
			}
		})
	}
}
