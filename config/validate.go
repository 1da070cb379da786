package config

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/spare"
)

// maxHookTimeout is the bound shim/hooks puts on a hook's own timeout.
const maxHookTimeout = 24 * time.Hour

var (
	accels     = []string{"auto", "kvm", "tcg"}
	cowChoices = []string{"probe", "yes", "no"}
)

// Validate checks every enumerated and required value, naming the key.
func (c Config) Validate() error {
	checks := []struct {
		key, val string
		valid    []string
	}{
		{"hypervisor", c.Hypervisor, hypervisor.Names},
		{"qemu.accel", c.QEMU.Accel, accels},
		{"cloud_hypervisor.copy_on_write", c.CloudHypervisor.CopyOnWrite, cowChoices},
	}
	for _, ch := range checks {
		if !slices.Contains(ch.valid, ch.val) {
			return fmt.Errorf("%s = %q: want one of %v", ch.key, ch.val, ch.valid)
		}
	}
	if _, err := hypervisor.ParseMode(c.Restore.Mode, true); err != nil {
		return fmt.Errorf("restore.mode: %w", err)
	}
	if c.Restore.ForceMode != "" {
		if _, err := hypervisor.ParseMode(c.Restore.ForceMode, false); err != nil {
			return fmt.Errorf("restore.force_mode (empty for none): %w", err)
		}
	}
	required := []struct{ key, val string }{
		{"shim.run_dir", c.Shim.RunDir},
		{"qemu.binary", c.QEMU.Binary},
		{"cloud_hypervisor.binary", c.CloudHypervisor.Binary},
		{"firecracker.binary", c.Firecracker.Binary},
		{"snapshotter.root", c.Snapshotter.Root},
		{"snapshotter.address", c.Snapshotter.Address},
	}
	for _, r := range required {
		if r.val == "" {
			return fmt.Errorf("%s is empty: want a value", r.key)
		}
	}
	if c.Restore.BaseImage != "" && len(c.Restore.BaseImages) > 0 {
		return fmt.Errorf("restore.base_image = %q and restore.base_images are both set: want one of them", c.Restore.BaseImage)
	}
	if slices.Contains(c.Restore.BaseImages, "") {
		return fmt.Errorf("restore.base_images = %q: want image references, none empty", c.Restore.BaseImages)
	}
	if c.Restore.MaxVCPUs < 0 {
		return fmt.Errorf("restore.max_vcpus = %d: want 0 (the host's CPUs) or a positive count", c.Restore.MaxVCPUs)
	}
	if c.Agent.ConnectTimeout <= 0 || c.Agent.CallTimeout <= 0 || c.Shim.RestoreTimeout <= 0 || c.Shim.HookTimeout <= 0 {
		return fmt.Errorf("agent.connect_timeout, agent.call_timeout, shim.restore_timeout and shim.hook_timeout must be positive")
	}
	if c.Shim.PodVM != PodVMPod && c.Shim.PodVM != PodVMContainer {
		return fmt.Errorf("shim.pod_vm = %q: want %q or %q", c.Shim.PodVM, PodVMPod, PodVMContainer)
	}
	if c.Shim.Spares < 1 || c.Shim.Spares > spare.MaxSpares {
		return fmt.Errorf("shim.spares = %d: want 1 to %d", c.Shim.Spares, spare.MaxSpares)
	}
	if !strings.HasPrefix(c.Shim.PoolCgroup, "/") || strings.Contains(c.Shim.PoolCgroup, ":") || c.Shim.PoolMemory < 0 {
		return fmt.Errorf("shim.pool_cgroup = %q, shim.pool_memory = %d: want an absolute cgroupfs path (no systemd slice) and a size of 0 (no limit) or more", c.Shim.PoolCgroup, c.Shim.PoolMemory)
	}
	if c.Shim.CopyFiles <= 0 || c.Shim.CopyBytes <= 0 {
		return fmt.Errorf("shim.copy_files = %d, shim.copy_bytes = %d: want both positive", c.Shim.CopyFiles, c.Shim.CopyBytes)
	}
	if c.Shim.HookTimeout.D() > maxHookTimeout {
		return fmt.Errorf("shim.hook_timeout = %v: want at most %v, the bound on a hook's own timeout", c.Shim.HookTimeout.D(), maxHookTimeout)
	}
	return nil
}
