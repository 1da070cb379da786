package server

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/server/procio"
)

// writeStdin writes all of b to the process's stdin.
func (p *process) writeStdin(ctx context.Context, b []byte) error {
	p.stdinMu.Lock()
	f := p.stdin
	p.stdinMu.Unlock()
	if f == nil {
		return fmt.Errorf("process %q has no open stdin: %w", p.id, errdefs.ErrFailedPrecondition)
	}
	if err := procio.Write(ctx, f, b); err != nil {
		return fmt.Errorf("process %q: %w", p.id, err)
	}
	return nil
}

// closeStdin closes a pipe stdin; on a terminal it sends end-of-file.
func (p *process) closeStdin() error {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin == nil {
		return nil
	}
	err := procio.CloseStdin(p.stdin, p.terminal)
	p.stdin = nil
	if err != nil {
		return fmt.Errorf("process %q: %w", p.id, err)
	}
	return nil
}
