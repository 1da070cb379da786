package shares

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// TestRefusals: what the host asks outside the shares' root, of a share
// not open, or past the bounds is refused before anything is mounted or
// written. (The shares themselves run in shim/share's tests, the guest's
// end on the host's kernel, and in the agent's TestVM, in the guest.)
func TestRefusals(t *testing.T) {
	root := t.TempDir()
	s := New(root)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		call func() error
		want error
	}{
		{"outside the root", func() error {
			_, err := s.OpenShare(ctx, &api.OpenShareRequest{Path: filepath.Join(root, "..", "x")})
			return err
		}, errdefs.ErrInvalidArgument},
		{"the root itself", func() error {
			_, err := s.OpenShare(ctx, &api.OpenShareRequest{Path: root})
			return err
		}, errdefs.ErrInvalidArgument},
		{"read a share not open", func() error {
			_, err := s.ReadShare(ctx, &api.ReadShareRequest{Id: 7})
			return err
		}, errdefs.ErrNotFound},
		{"close a share not open", func() error {
			_, err := s.CloseShare(ctx, &api.CloseShareRequest{Id: 7})
			return err
		}, errdefs.ErrNotFound},
		{"a reply too large", func() error {
			_, err := s.WriteShare(ctx, &api.WriteShareRequest{Id: 7, Replies: [][]byte{make([]byte, api.MaxShareMsg+1)}})
			return err
		}, errdefs.ErrInvalidArgument},
		{"replies too large together", func() error {
			r := make([]byte, api.MaxShareMsg)
			_, err := s.WriteShare(ctx, &api.WriteShareRequest{Id: 7, Replies: [][]byte{r, r, r, r, r, r, r, r}})
			return err
		}, errdefs.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
}
