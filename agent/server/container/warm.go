package container

import (
	"context"
	"fmt"

	runc "github.com/containerd/go-runc"
)

// Warm runs runc once with nothing to create (runc --version) and waits
// for it. Under TCG a restored guest translates anew all the code it runs,
// and every runc call starts the same way (the Go runtime's and runc's
// packages' initialization, ~150 ms of it): run while the host prepares a
// pod's first container, it leaves that container's `runc create` less to
// translate.
func (m *Manager) Warm(ctx context.Context) error {
	if _, err := (&runc.Runc{Command: m.cfg.Runc}).Version(ctx); err != nil {
		return fmt.Errorf("run %s --version: %w", m.cfg.Runc, err)
	}
	return nil
}

// Warm is the manager's Warm.
func (r *RPC) Warm(ctx context.Context) error { return r.m.Warm(ctx) }
