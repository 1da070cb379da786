// Package staging decides what a node stages as the memory of a chain: the
// flat file of the whole chain, or that of a prefix flattened earlier plus
// the top links' pages for the restore to write into the guest. It is the
// restore policy's (restore.Decide reports it), kept apart so that the
// snapshotter, which decides at staging, does not link the drivers.
package staging

import (
	"fmt"

	"github.com/docker/go-units"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// deltaHypervisors restore from a staged memory file that holds only a
// prefix of the chain: they write the other links' pages into the guest's
// memory before it runs. QEMU does (its private mapping under mmap, the
// memfd under copy); Cloud Hypervisor and Firecracker read guest memory
// only from files they open themselves.
var deltaHypervisors = map[string]bool{hypervisor.QEMU: true}

// WritesDeltas reports whether hv restores a chain staged with deltas.
func WritesDeltas(hv string) bool { return deltaHypervisors[hv] }

// maxDeltaShare is the largest share (1/maxDeltaShare) of the memory the
// links above a cached prefix may carry for them to be staged as deltas.
// Past it the chain is flattened once: every restore then shares the flat
// file's page cache, where each would hold the delta's pages privately.
const maxDeltaShare = 4

// Memory decides what a node stages as the memory of a chain of links
// (oldest first), given which chains are flattened on it: cached(i) reports
// whether the flat file of the chain ending at link i is. The staged file
// holds the first Covers links; when that is not all of them, the restore
// writes the others' pages into the guest (O(delta) instead of a flatten of
// the whole memory). Reason says why, for restore reports.
func Memory(links []*chain.Link, cached func(i int) bool) chain.StagedMemoryInfo {
	n := len(links)
	top := links[n-1]
	all := func(format string, args ...any) chain.StagedMemoryInfo {
		return chain.StagedMemoryInfo{Covers: n, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case cached(n - 1):
		return all("the chain's flat file is cached on this node")
	case n == 1:
		return all("the chain's one link is flattened on this node first")
	case !deltaHypervisors[top.Hypervisor]:
		return all("the chain is flattened whole: %s restores guest memory only from one file", top.Hypervisor)
	}
	for k := n - 1; k >= 1; k-- {
		if !cached(k - 1) {
			continue
		}
		var delta int64
		for _, l := range links[k:] {
			delta += l.Memory.DataBytes
		}
		size := units.BytesSize(float64(delta))
		if delta > top.MemoryBytes/maxDeltaShare {
			return all("the top %d of %d links carry %s of pages, over 1/%d of the %s memory: the chain is flattened once, for every restore to share",
				n-k, n, size, maxDeltaShare, units.BytesSize(float64(top.MemoryBytes)))
		}
		return chain.StagedMemoryInfo{Covers: k, Reason: fmt.Sprintf(
			"links 1-%d are flattened on this node: the restore writes the top %d link(s), %s of pages, into the guest before it runs instead of flattening %s",
			k, n-k, size, units.BytesSize(float64(top.MemoryBytes)))}
	}
	return all("no prefix of the chain is flattened on this node: the chain is flattened once")
}
