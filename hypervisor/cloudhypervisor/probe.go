package cloudhypervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/vmmproc"
)

// probeTimeout bounds each question put to the binary.
const probeTimeout = 5 * time.Second

// version asks the binary for its build string (`cloud-hypervisor v53.0`).
func version(ctx context.Context, binary string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, binary, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", binary, err)
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line, nil
}

// probeCopyOnWrite asks a throwaway process of binary whether it accepts
// memory_restore_mode "CopyOnWrite". Version strings do not tell (the
// cocoonstack fork keeps upstream's numbering), so the probe asks the API:
// it restores from an empty directory with that mode. A build without the
// mode refuses to parse the request (400 naming CopyOnWrite, from serde's
// unknown-variant error); a build with it parses the request and then fails
// to read the missing snapshot, with any other error.
func probeCopyOnWrite(ctx context.Context, binary string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	dir, err := os.MkdirTemp("", "cocoon-ch-probe-")
	if err != nil {
		return false, fmt.Errorf("create probe dir: %w", err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, apiSock)
	p, err := vmmproc.Start(ctx, dir, vmmproc.Spec{Binary: binary, Args: apiArgs(sock), Log: vmmLog, Socket: sock})
	if err != nil {
		return false, err
	}
	defer p.Stop()
	empty := filepath.Join(dir, "empty")
	if err := os.Mkdir(empty, 0o700); err != nil {
		return false, fmt.Errorf("create probe dir: %w", err)
	}
	err = newAPIClient(sock).put(ctx, "vm.restore", restoreConfig{
		SourceURL: "file://" + empty, MemoryRestoreMode: "CopyOnWrite",
	})
	var apiErr *APIError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &apiErr):
		refused := apiErr.Status == 400 && strings.Contains(apiErr.Body, "CopyOnWrite")
		return !refused, nil
	default:
		return false, fmt.Errorf("probe CopyOnWrite: %w", err)
	}
}
