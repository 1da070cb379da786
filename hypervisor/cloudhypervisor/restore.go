package cloudhypervisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/log"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/attach"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/stagedchain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/vmmproc"
)

// restoreConfig is the vm.restore body (RestoreConfig in the spec).
type restoreConfig struct {
	SourceURL         string `json:"source_url"`
	MemoryRestoreMode string `json:"memory_restore_mode,omitempty"`
}

// Restore spawns Cloud Hypervisor and restores req.StagedDir into it,
// paused. Cloud Hypervisor runs in req.NetNS when set, and opens req.NIC's
// tap by name for the snapshot's network device; without a NIC, a
// snapshot's network device gets a tap Cloud Hypervisor makes in a network
// namespace of its own, which goes with it. req.Disk backs the snapshot's
// rootfs slot. On error the process is killed and req.RunDir removed.
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
	host := hostBackends{NetNS: req.NetNS != nil, Disk: disk}
	if req.NIC != nil {
		host.Tap = req.NIC.TapName
	}
	var p patched
	if v.source, p, err = materialize(staged, req.RunDir, host); err != nil {
		return nil, err
	}
	if err := v.start(ctx, d.cfg.Binary, req, p.ownNetNS); err != nil {
		return nil, err
	}
	if err := attach.ReleaseQueue(req.NIC); err != nil {
		return nil, err
	}
	if err := v.load(ctx, req); err != nil {
		return nil, err
	}
	log.G(ctx).WithFields(log.Fields{"pid": v.PID(), "mode": req.Mode, "run_dir": req.RunDir}).Debug("restored cloud hypervisor vm, paused")
	return v, nil
}

// apiArgs is the command line serving the API on sock.
func apiArgs(sock string) []string {
	return []string{"--api-socket", "path=" + sock}
}

// start spawns the process, in req.NetNS or in a network namespace of its
// own, and waits for its API socket.
func (v *vm) start(ctx context.Context, binary string, req hypervisor.RestoreRequest, ownNetNS bool) error {
	sock := filepath.Join(v.RunDir, apiSock)
	begin := time.Now()
	spec := vmmproc.Spec{Binary: binary, Args: apiArgs(sock), Log: vmmLog, Socket: sock, NetNS: req.NetNS, OwnNetNS: ownNetNS, BornIn: req.BornIn(), Attached: req.Attached}
	if err := v.Instance.Start(ctx, spec); err != nil {
		return err
	}
	v.api = newAPIClient(sock)
	req.Phase("spawn", time.Since(begin))
	return nil
}

// load asks for vm.restore and, for copy restores, drops the run's own
// name of the memory file once Cloud Hypervisor has read it (the staged
// one is the caller's, see hypervisor.ModeCopy).
func (v *vm) load(ctx context.Context, req hypervisor.RestoreRequest) error {
	mode, err := memoryRestoreMode(req.Mode)
	if err != nil {
		return err
	}
	begin := time.Now()
	if err := v.api.put(ctx, "vm.restore", restoreConfig{SourceURL: "file://" + v.source, MemoryRestoreMode: mode}); err != nil {
		return fmt.Errorf("restore %s: %w", req.StagedDir, err)
	}
	req.Phase("load", time.Since(begin))
	if req.Mode != hypervisor.ModeCopy {
		return nil
	}
	if err := os.Remove(filepath.Join(v.source, memoryFile)); err != nil {
		return fmt.Errorf("drop restored memory link: %w", err)
	}
	return nil
}
