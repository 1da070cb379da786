package agent

import (
	"context"
	"fmt"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// UpdateFiles writes files in the guest in order (a link replaces the
// link there in one rename), then removes the paths in remove; all must be
// under the guest's copies of bind sources.
func (c *Client) UpdateFiles(ctx context.Context, files []File, remove []string) error {
	if err := c.requireVersion(ctx, apiVersion7, "a live volume"); err != nil {
		return err
	}
	req, err := initFiles(files)
	if err != nil {
		return fmt.Errorf("update files in guest: %w", err)
	}
	if _, err := c.api.UpdateFiles(ctx, &api.UpdateFilesRequest{Files: req, Remove: remove}); err != nil {
		return fmt.Errorf("update files in guest: %w", native(err))
	}
	return nil
}
