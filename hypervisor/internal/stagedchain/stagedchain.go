// Package stagedchain is what the drivers do alike with a staged chain:
// check it suits the driver before a restore (Cloud Hypervisor,
// Firecracker) and describe the links a VM restored from it snapshots
// (every driver).
package stagedchain

import (
	"context"
	"fmt"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// Open opens req.StagedDir for d, once sure that d restores in req.Mode
// and that the chain is a snapshot of d's hypervisor. It returns d's
// capabilities too: their Build goes into the links the VM snapshots.
func Open(ctx context.Context, d hypervisor.Driver, req hypervisor.RestoreRequest) (*chain.Staged, hypervisor.Capabilities, error) {
	caps, err := d.Capabilities(ctx)
	if err != nil {
		return nil, caps, err
	}
	if !caps.Supports(req.Mode) {
		return nil, caps, fmt.Errorf("restore mode %q: %s (%s) supports %v", req.Mode, d.Name(), caps.Build, caps.RestoreModes)
	}
	staged, err := req.OpenStaged(d.Name())
	if err != nil {
		return nil, caps, err
	}
	return staged, caps, nil
}

// Meta describes the links a VM restored from staged snapshots: the guest
// is the one restored, the hypervisor the one running it.
func Meta(staged *chain.Staged, hypervisorName, build string, stateFiles []string) chain.Meta {
	top := staged.Top()
	return chain.Meta{
		Hypervisor: hypervisorName, HypervisorBuild: build, GuestOS: top.GuestOS,
		VCPUs: top.VCPUs, PageSize: top.PageSize,
		HugePages: top.HugePages, SharedMemory: top.SharedMemory,
		StateFiles: stateFiles,
	}
}
