package firecracker

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/log"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/firecracker/uffd"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/attach"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/stagedchain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/vmmproc"
)

// memBackend is MemoryBackend in the spec.
type memBackend struct {
	BackendType string `json:"backend_type"`
	BackendPath string `json:"backend_path"`
}

// vsockOverride is VsockOverride in the spec.
type vsockOverride struct {
	UDSPath string `json:"uds_path"`
}

// snapshotLoad is the PUT /snapshot/load body (SnapshotLoadParams). Dirty
// page tracking is always on, so that Diff snapshots hold the pages
// changed since the load (see Snapshot).
type snapshotLoad struct {
	SnapshotPath     string            `json:"snapshot_path"`
	MemBackend       memBackend        `json:"mem_backend"`
	TrackDirtyPages  bool              `json:"track_dirty_pages"`
	ResumeVM         bool              `json:"resume_vm"`
	VsockOverride    *vsockOverride    `json:"vsock_override,omitempty"`
	NetworkOverrides []networkOverride `json:"network_overrides,omitempty"`
}

// Restore spawns Firecracker and loads req.StagedDir into it, paused.
// Firecracker runs in req.NetNS when set, or without a NIC in a network
// namespace of its own (see hostBackends); req.NIC's tap goes behind the
// snapshot's network interface nicIfaceID, and req.Disk behind its rootfs
// slot (see placeRootfs). On error the process is killed and req.RunDir
// removed.
func (d *Driver) Restore(ctx context.Context, req hypervisor.RestoreRequest) (_ hypervisor.VM, retErr error) {
	staged, caps, err := stagedchain.Open(ctx, d, req)
	if err != nil {
		return nil, err
	}
	disk, err := attach.Check(req)
	if err != nil {
		return nil, err
	}
	inst, err := vmmproc.NewInstance(req.RunDir)
	if err != nil {
		return nil, err
	}
	v := &vm{Instance: inst, staged: staged, build: caps.Build}
	defer func() {
		if retErr != nil {
			v.Close()
		}
	}()
	host := newHostBackends(req, disk)
	backend, err := v.memoryBackend(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := placeRootfs(req.RunDir, disk); err != nil {
		return nil, err
	}
	if err := v.start(ctx, d.cfg.Binary, req, host.OwnNetNS); err != nil {
		return nil, err
	}
	if err := attach.ReleaseQueue(req.NIC); err != nil {
		return nil, err
	}
	if err := v.load(ctx, req, backend, host); err != nil {
		return nil, err
	}
	log.G(ctx).WithFields(log.Fields{"pid": v.PID(), "mode": req.Mode, "run_dir": req.RunDir}).Debug("restored firecracker vm, paused")
	return v, nil
}

// memoryBackend prepares guest memory for req.Mode.
func (v *vm) memoryBackend(ctx context.Context, req hypervisor.RestoreRequest) (memBackend, error) {
	switch req.Mode {
	case hypervisor.ModeMmap:
		return memBackend{BackendType: "File", BackendPath: v.staged.MemoryPath()}, nil
	case hypervisor.ModeCopy:
		dst := filepath.Join(v.RunDir, memCopy)
		begin := time.Now()
		// The copy's pages are the guest's memory: charged to the VM.
		if err := req.Charge(func() error { return copyMemory(v.staged.MemoryPath(), dst) }); err != nil {
			return memBackend{}, err
		}
		req.Phase("copy", time.Since(begin))
		return memBackend{BackendType: "File", BackendPath: dst}, nil
	case hypervisor.ModeOnDemand:
		return v.serveFaults(ctx)
	}
	return memBackend{}, fmt.Errorf("restore mode %q: %s supports %v", req.Mode, Name, restoreModes)
}

// serveFaults starts the page-fault handler for the Uffd backend. It lives
// as long as the VM, not the restore request, so it gets a context that is
// never cancelled (keeping ctx's logger); Close stops it.
func (v *vm) serveFaults(ctx context.Context) (memBackend, error) {
	sock := filepath.Join(v.RunDir, uffdSock)
	if err := vmmproc.CheckSockPath(sock); err != nil {
		return memBackend{}, err
	}
	h, err := uffd.Listen(context.WithoutCancel(ctx), sock, v.staged.MemoryPath())
	if err != nil {
		return memBackend{}, fmt.Errorf("start page-fault handler: %w", err)
	}
	v.faults = h
	return memBackend{BackendType: "Uffd", BackendPath: sock}, nil
}

// start spawns the process, in req.NetNS or in a network namespace of its
// own, and waits for its API socket.
func (v *vm) start(ctx context.Context, binary string, req hypervisor.RestoreRequest, ownNetNS bool) error {
	sock := filepath.Join(v.RunDir, apiSock)
	// Firecracker binds the vsock socket there too (vsock_override).
	if err := vmmproc.CheckSockPath(filepath.Join(v.RunDir, vsockSock)); err != nil {
		return err
	}
	begin := time.Now()
	spec := vmmproc.Spec{Binary: binary, Args: []string{"--api-sock", sock}, Log: vmmLog, Socket: sock, NetNS: req.NetNS, OwnNetNS: ownNetNS, BornIn: req.BornIn(), Attached: req.Attached}
	if err := v.Instance.Start(ctx, spec); err != nil {
		return err
	}
	v.api = newAPIClient(sock)
	req.Phase("spawn", time.Since(begin))
	return nil
}

// load loads the snapshot paused with host's overrides, refuses it if its
// devices use host ends this restore did not give (see checkRestored)
// and, for copy restores, drops the name of the private copy once
// Firecracker has mapped it (the staged memory is the caller's, see
// hypervisor.ModeCopy).
func (v *vm) load(ctx context.Context, req hypervisor.RestoreRequest, backend memBackend, host hostBackends) error {
	vmstate := v.staged.StatePath(vmstateFile)
	// Firecracker reads it whole: it must be a bounded regular file.
	f, err := chain.OpenLinkFile(vmstate, chain.MaxStateFile)
	if err != nil {
		return fmt.Errorf("restore %s: %w", req.StagedDir, err)
	}
	f.Close()
	body := snapshotLoad{
		SnapshotPath:     vmstate,
		MemBackend:       backend,
		TrackDirtyPages:  true,
		VsockOverride:    &vsockOverride{UDSPath: host.Vsock},
		NetworkOverrides: host.overrides(),
	}
	begin := time.Now()
	if err := v.api.call(ctx, "PUT", "snapshot/load", body); err != nil {
		return fmt.Errorf("restore %s%s: %w", req.StagedDir, host.describe(), err)
	}
	if err := v.checkRestored(ctx, host); err != nil {
		return fmt.Errorf("restore %s: %w", req.StagedDir, err)
	}
	req.Phase("load", time.Since(begin))
	if req.Mode != hypervisor.ModeCopy {
		return nil
	}
	if err := os.Remove(backend.BackendPath); err != nil {
		return fmt.Errorf("drop private memory name: %w", err)
	}
	return nil
}
