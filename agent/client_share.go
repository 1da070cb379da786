package agent

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// apiVersion9 is the first with the share calls.
const apiVersion9 = 9

// Share is a FUSE file system the agent mounted in the guest, whose
// requests the host serves: a host directory shared with the VM.
type Share struct {
	Path string

	c  *Client
	id uint64
}

// OpenShare mounts a share at path in the guest (a new directory under
// the guest's bind sources), read-only when readOnly says so.
func (c *Client) OpenShare(ctx context.Context, path string, readOnly bool) (*Share, error) {
	if err := c.requireVersion(ctx, apiVersion9, "a shared directory"); err != nil {
		return nil, err
	}
	resp, err := c.api.OpenShare(ctx, &api.OpenShareRequest{Path: path, ReadOnly: readOnly})
	if err != nil {
		return nil, fmt.Errorf("open share at %s in guest: %w", path, native(err))
	}
	return &Share{Path: path, c: c, id: resp.Id}, nil
}

// Read waits for the guest kernel's requests of the share: at least one,
// or eof once the file system is gone. Each is checked against the bounds
// of a FUSE message; the guest is not trusted to keep them.
func (s *Share) Read(ctx context.Context) (reqs [][]byte, eof bool, _ error) {
	resp, err := s.c.api.ReadShare(ctx, &api.ReadShareRequest{Id: s.id})
	if err != nil {
		return nil, false, fmt.Errorf("read share at %s: %w", s.Path, native(err))
	}
	for _, r := range resp.Requests {
		if len(r) == 0 || len(r) > api.MaxShareMsg {
			return nil, false, fmt.Errorf("read share at %s: the guest sent a request of %d bytes, expected 1 to %d: %w", s.Path, len(r), api.MaxShareMsg, errdefs.ErrInvalidArgument)
		}
	}
	return resp.Requests, resp.Eof, nil
}

// Write hands the guest kernel replies to its requests.
func (s *Share) Write(ctx context.Context, replies [][]byte) error {
	if _, err := s.c.api.WriteShare(ctx, &api.WriteShareRequest{Id: s.id, Replies: replies}); err != nil {
		return fmt.Errorf("write share at %s: %w", s.Path, native(err))
	}
	return nil
}

// Close unmounts the share in the guest.
func (s *Share) Close(ctx context.Context) error {
	if _, err := s.c.api.CloseShare(ctx, &api.CloseShareRequest{Id: s.id}); err != nil {
		return fmt.Errorf("close share at %s: %w", s.Path, native(err))
	}
	return nil
}

// CanShare says whether the guest's agent has the share calls.
func (c *Client) CanShare(ctx context.Context) (bool, error) {
	v, err := c.apiVersion(ctx)
	return v >= apiVersion9, err
}
