// Package shares is the guest's end of a host directory shared with the
// VM: a FUSE file system the agent mounts, whose requests the host pulls
// and whose replies it pushes a call at a time, raw FUSE messages both
// ways. The host serves them from the directory; the guest only relays.
package shares

import (
	"context"
	"fmt"
	"os"
	"sync"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/server/guestfile"
)

// Shares are the mounted shares, served as the agent API's share calls.
type Shares struct {
	root string // shares are mounted strictly under it

	mu     sync.Mutex
	next   uint64
	shares map[uint64]*share
}

// New returns an empty set whose shares go under root.
func New(root string) *Shares {
	return &Shares{root: root, shares: map[uint64]*share{}}
}

// OpenShare mounts a FUSE file system at req's path, a directory it makes.
func (s *Shares) OpenShare(ctx context.Context, req *api.OpenShareRequest) (*api.OpenShareResponse, error) {
	if err := guestfile.Beneath(s.root, req.Path); err != nil {
		return nil, fmt.Errorf("open share: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.shares) >= api.MaxShares {
		return nil, fmt.Errorf("open share at %s: %d shares are mounted, the most the agent keeps: %w", req.Path, api.MaxShares, errdefs.ErrResourceExhausted)
	}
	sh, err := mount(req.Path, req.ReadOnly)
	if err != nil {
		return nil, err
	}
	s.next++
	s.shares[s.next] = sh
	return &api.OpenShareResponse{Id: s.next}, nil
}

// ReadShare blocks until the kernel made a request of the share, the
// file system is gone (eof) or the call ends, and returns that request
// with those made meanwhile, up to api.MaxShareBatch bytes.
func (s *Shares) ReadShare(ctx context.Context, req *api.ReadShareRequest) (*api.ReadShareResponse, error) {
	sh, err := s.get(req.Id)
	if err != nil {
		return nil, err
	}
	reqs, eof, err := sh.read(ctx)
	if err != nil {
		return nil, fmt.Errorf("read share %d: %w", req.Id, err)
	}
	return &api.ReadShareResponse{Requests: reqs, Eof: eof}, nil
}

// WriteShare hands the kernel the host's replies.
func (s *Shares) WriteShare(ctx context.Context, req *api.WriteShareRequest) (*emptypb.Empty, error) {
	total := 0
	for _, r := range req.Replies {
		if len(r) > api.MaxShareMsg {
			return nil, fmt.Errorf("write share %d: a reply of %d bytes, expected at most %d: %w", req.Id, len(r), api.MaxShareMsg, errdefs.ErrInvalidArgument)
		}
		total += len(r)
	}
	if total > api.MaxShareBatch {
		return nil, fmt.Errorf("write share %d: %d bytes of replies, expected at most %d a call: %w", req.Id, total, api.MaxShareBatch, errdefs.ErrInvalidArgument)
	}
	sh, err := s.get(req.Id)
	if err != nil {
		return nil, err
	}
	for _, r := range req.Replies {
		if err := sh.write(r); err != nil {
			return nil, fmt.Errorf("write share %d: %w", req.Id, err)
		}
	}
	return &emptypb.Empty{}, nil
}

// CloseShare unmounts the share and forgets it.
func (s *Shares) CloseShare(ctx context.Context, req *api.CloseShareRequest) (*emptypb.Empty, error) {
	s.mu.Lock()
	sh, ok := s.shares[req.Id]
	delete(s.shares, req.Id)
	s.mu.Unlock()
	if !ok {
		return nil, notOpen(req.Id)
	}
	if err := sh.close(); err != nil {
		return nil, fmt.Errorf("close share %d: %w", req.Id, err)
	}
	return &emptypb.Empty{}, nil
}

func (s *Shares) get(id uint64) (*share, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sh, ok := s.shares[id]
	if !ok {
		return nil, notOpen(id)
	}
	return sh, nil
}

func notOpen(id uint64) error {
	return fmt.Errorf("share %d is not open: %w", id, errdefs.ErrNotFound)
}

// mount makes directory path and mounts a FUSE file system there, served
// through the /dev/fuse handle share keeps. Permissions are the kernel's
// to check, on the attributes the host reports (default_permissions):
// the host serves every request as root.
func mount(path string, readOnly bool) (*share, error) {
	if err := os.MkdirAll(path, 0o755); err != nil {
		return nil, fmt.Errorf("open share: %w", err)
	}
	dev, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open share at %s: open /dev/fuse: %w", path, err)
	}
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
	if readOnly {
		flags |= unix.MS_RDONLY
	}
	opts := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0,allow_other,default_permissions", dev)
	if err := unix.Mount("cocoon-share", path, "fuse", flags, opts); err != nil {
		unix.Close(dev)
		_ = os.Remove(path)
		return nil, fmt.Errorf("open share at %s: mount: %w", path, err)
	}
	sh, err := newShare(path, dev)
	if err != nil {
		_ = unix.Unmount(path, unix.MNT_DETACH)
		unix.Close(dev)
		return nil, fmt.Errorf("open share at %s: %w", path, err)
	}
	return sh, nil
}
