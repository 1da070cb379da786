package server

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/server/guestfile"
)

// bindCopies is where, under the state dir, the host's copies of bind
// sources are: the only files UpdateFiles changes.
const bindCopies = "binds"

// UpdateFiles writes req's files in order, then removes its paths, all
// under the copies of bind sources: the host keeps a Kubernetes volume's
// copy in step with kubelet's updates of it, and sends what one Init or
// CreateContainer cannot carry, large files in pieces.
func (s *Service) UpdateFiles(ctx context.Context, req *api.UpdateFilesRequest) (*emptypb.Empty, error) {
	root := filepath.Join(s.stateDir, bindCopies)
	if len(req.Remove) > api.MaxFiles {
		return nil, fmt.Errorf("update files: %d paths to remove, expected at most %d: %w", len(req.Remove), api.MaxFiles, errdefs.ErrInvalidArgument)
	}
	files, err := guestfile.CheckPieces(req.Files)
	if err != nil {
		return nil, fmt.Errorf("update files: %w", err)
	}
	for _, f := range files {
		if err := guestfile.Beneath(root, f.Path); err != nil {
			return nil, fmt.Errorf("update files: %w", err)
		}
	}
	for _, p := range req.Remove {
		if err := guestfile.Beneath(root, p); err != nil {
			return nil, fmt.Errorf("update files: remove: %w", err)
		}
	}
	if err := guestfile.Write(files); err != nil {
		return nil, fmt.Errorf("update files: %w", err)
	}
	for _, p := range req.Remove {
		if err := guestfile.Remove(p); err != nil {
			return nil, fmt.Errorf("update files: %w", err)
		}
	}
	return &emptypb.Empty{}, nil
}
