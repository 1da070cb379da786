package vm

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/drivers"
)

// driver returns the driver for cfg's hypervisor, one per distinct driver
// config for the life of the shim: a driver probes its binary once (Cloud
// Hypervisor's CopyOnWrite probe starts a throwaway VMM), so the later tasks
// of a shim skip that.
func (l *Launcher) driver(cfg config.Config) (hypervisor.Driver, error) {
	key, err := json.Marshal(struct {
		Hypervisor      string
		QEMU            config.QEMU
		CloudHypervisor config.CloudHypervisor
		Firecracker     config.Firecracker
	}{cfg.Hypervisor, cfg.QEMU, cfg.CloudHypervisor, cfg.Firecracker})
	if err != nil {
		return nil, fmt.Errorf("hypervisor driver key: %w", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if d, ok := l.drivers[string(key)]; ok {
		return d, nil
	}
	newDriver := l.NewDriver
	if newDriver == nil {
		newDriver = drivers.New
	}
	d, err := newDriver(cfg)
	if err != nil {
		return nil, fmt.Errorf("hypervisor driver: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	if l.drivers == nil {
		l.drivers = map[string]hypervisor.Driver{}
	}
	l.drivers[string(key)] = d
	return d, nil
}

// Warm probes the hypervisor of the default config ($COCOON_CONFIG, else
// /etc/cocoon/config.toml, else built-in) in the background, so the probe
// overlaps the first Create's way to the shim instead of preceding its
// restore. A task asking for another config probes its own driver.
func (l *Launcher) Warm(ctx context.Context) {
	cfg, err := config.Load("")
	if err != nil {
		return // the Create that uses this config reports it
	}
	d, err := l.driver(cfg)
	if err != nil {
		return
	}
	go func() {
		if _, err := d.Capabilities(ctx); err != nil {
			log.G(ctx).WithError(err).WithField("hypervisor", d.Name()).Debug("warm hypervisor probe")
		}
	}()
}
