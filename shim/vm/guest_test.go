package vm

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
)

// TestGuestCallTimeout: the configured agent.call_timeout is what bounds a
// call to a guest that never answers, whatever the caller's context allows.
func TestGuestCallTimeout(t *testing.T) {
	host, guestEnd := net.Pipe()
	go func() { _, _ = io.Copy(io.Discard, guestEnd) }() // reads every request, answers none
	c := agent.NewClient(host)
	t.Cleanup(func() { c.Close(); guestEnd.Close() })
	const timeout = 200 * time.Millisecond
	g := NewGuest(c, timeout)
	for name, call := range map[string]func(context.Context) error{
		"signal":    func(ctx context.Context) error { return g.Signal(ctx, "init", 15) },
		"delete":    func(ctx context.Context) error { return g.Delete(ctx, "init") },
		"processes": func(ctx context.Context) error { _, err := g.Processes(ctx); return err },
	} {
		t.Run(name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() { done <- call(context.Background()) }()
			select {
			case err := <-done:
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("call to a silent guest: %v, want the call timeout", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("call to a silent guest was not bounded by agent.call_timeout")
			}
		})
	}
}
