package agent

import (
	"context"
	"fmt"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// apiVersion8 is the first that takes files in pieces and directories
// that are a tmpfs of their own.
const apiVersion8 = 8

// UpdateFiles writes files in the guest in order (a link replaces the
// link there in one rename), then removes the paths in remove; all must be
// under the guest's copies of bind sources. What one request cannot carry
// goes in several, in order, the removals last; a file of more than
// api.MaxFileSize bytes goes in pieces (agent API 8).
func (c *Client) UpdateFiles(ctx context.Context, files []File, remove []string) error {
	if err := c.requireVersion(ctx, apiVersion7, "a live volume"); err != nil {
		return err
	}
	reqs, pieced, err := fileRequests(files, remove)
	if err != nil {
		return fmt.Errorf("update files in guest: %w", err)
	}
	if pieced {
		if err := c.requireVersion(ctx, apiVersion8, fmt.Sprintf("a file of more than %d bytes", api.MaxFileSize)); err != nil {
			return fmt.Errorf("update files in guest: %w", err)
		}
	}
	if tmpfsIn(files) {
		if err := c.requireVersion(ctx, apiVersion8, tmpfsNeeds); err != nil {
			return fmt.Errorf("update files in guest: %w", err)
		}
	}
	for _, req := range reqs {
		if _, err := c.api.UpdateFiles(ctx, req); err != nil {
			return fmt.Errorf("update files in guest: %w", native(err))
		}
	}
	return nil
}

// fileRequests splits files and remove into UpdateFiles requests within
// the agent's bounds, in order, and says whether a file went in pieces.
func fileRequests(files []File, remove []string) ([]*api.UpdateFilesRequest, bool, error) {
	var reqs []*api.UpdateFilesRequest
	cur, size, pieced := &api.UpdateFilesRequest{}, 0, false
	next := func() {
		reqs = append(reqs, cur)
		cur, size = &api.UpdateFilesRequest{}, 0
	}
	add := func(f *api.File) {
		if len(cur.Files) == api.MaxFiles || size+len(f.Data) > api.MaxFilesSize {
			next()
		}
		cur.Files = append(cur.Files, f)
		size += len(f.Data)
	}
	for _, f := range files {
		af, err := apiFile(f)
		if err != nil {
			return nil, false, err
		}
		if len(af.Data) <= api.MaxFileSize {
			add(af)
			continue
		}
		pieced = true
		for off := 0; off < len(af.Data); off += api.MaxFileSize {
			end := min(off+api.MaxFileSize, len(af.Data))
			add(&api.File{Path: af.Path, Data: af.Data[off:end], Mode: af.Mode, Offset: uint64(off), More: end < len(af.Data)})
		}
	}
	for len(remove) > 0 {
		if len(cur.Remove) == api.MaxFiles {
			next()
		}
		n := min(api.MaxFiles-len(cur.Remove), len(remove))
		cur.Remove, remove = append(cur.Remove, remove[:n]...), remove[n:]
	}
	next()
	return reqs, pieced, nil
}

// fitsOne says whether files fit one Init or CreateContainer request.
func fitsOne(files []File) bool {
	if len(files) > api.MaxFiles {
		return false
	}
	total := 0
	for _, f := range files {
		if len(f.Data) > api.MaxFileSize {
			return false
		}
		total += len(f.Data)
	}
	return total <= api.MaxFilesSize
}

// sendAhead sends files that one request cannot carry with UpdateFiles,
// before the Init or CreateContainer that then carries none.
func (c *Client) sendAhead(ctx context.Context, files []File) ([]File, error) {
	if fitsOne(files) {
		return files, nil
	}
	return nil, c.UpdateFiles(ctx, files, nil)
}
