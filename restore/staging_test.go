package restore

import (
	"strings"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// stagedChain is a chain of n hv links of 512 MiB memory.
func stagedChain(hv string, n int) []*chain.Link {
	links := make([]*chain.Link, n)
	for i := range links {
		links[i] = linuxLink(hv)
	}
	return links
}

// The plan says how the memory was staged; a driver that cannot write
// pending links into its guest refuses a chain staged with some.
func TestDecideReportsStaging(t *testing.T) {
	for _, tt := range []struct {
		name, hv string
		mem      chain.StagedMemoryInfo
		want     string // in a reason, or the error when bad
		bad      bool
	}{
		{"deltas", "qemu", chain.StagedMemoryInfo{Covers: 2, Reason: "links 1-2 are flattened"}, "holds links 1-2 and the restore writes the top 1 into the guest before it runs (links 1-2 are flattened)", false},
		{"whole", "qemu", chain.StagedMemoryInfo{Covers: 3, Reason: "cached"}, "holds the whole chain (cached)", false},
		{"deltas elsewhere", "cloud-hypervisor", chain.StagedMemoryInfo{Covers: 1}, "cloud-hypervisor cannot write the others", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			staged := &chain.Staged{Links: stagedChain(tt.hv, 3), Memory: tt.mem}
			p, err := Decide(Inputs{
				Hypervisor: tt.hv, Caps: hypervisor.Capabilities{RestoreModes: []hypervisor.Mode{mmap, cp}},
				Link: staged.Top(), Config: config.Default().Restore, Staged: staged,
			})
			if tt.bad {
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("plan %+v, %v; want an error containing %q", p, err, tt.want)
				}
				return
			}
			if err != nil || !strings.Contains(strings.Join(p.Reasons, "\n"), tt.want) {
				t.Fatalf("reasons %q, %v; want one containing %q", p.Reasons, err, tt.want)
			}
		})
	}
}
