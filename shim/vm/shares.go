package vm

import (
	"context"
	"errors"
	"fmt"
	"path"
	"sync"
	"time"

	"github.com/containerd/log"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/share"
)

// shareSources is where a VM's shares are mounted in the guest.
const shareSources = bindSources + "/.shares"

// shareCloseTimeout bounds the unmount of one share in the guest at the
// VM's end.
const shareCloseTimeout = 5 * time.Second

var errSharesClosed = errors.New("the VM is gone")

// vmShares are the host directories a VM's containers bind that it sees
// live (package share), one share per directory and access: what a
// container writes there is on the host at once and what the host
// changes, a mount under it too, shows in the guest, as under runc. A
// share lives as long as the VM.
type vmShares struct {
	mu    sync.Mutex
	n     int
	byKey map[shareKey]*dirShare
}

type shareKey struct {
	host   string
	access share.Access
}

// dirShare is one share, served by the first open (srv), or failed (err).
type dirShare struct {
	guest string
	once  sync.Once
	err   error
	srv   *share.Server
}

func newVMShares() *vmShares {
	return &vmShares{byKey: map[shareKey]*dirShare{}}
}

// place returns where key's directory is shared in the guest; open
// serves it there.
func (s *vmShares) place(k shareKey) *dirShare {
	s.mu.Lock()
	defer s.mu.Unlock()
	sh, ok := s.byKey[k]
	if !ok {
		s.n++
		sh = &dirShare{guest: path.Join(shareSources, fmt.Sprint(s.n))}
		s.byKey[k] = sh
	}
	return sh
}

// open serves, through a, the shares a container binds; those another
// container opened already are. One that fails is forgotten, for the
// next container to try again.
func (s *vmShares) open(ctx context.Context, a *agent.Client, shares map[shareKey]*dirShare) error {
	for k, sh := range shares {
		sh.once.Do(func() { sh.srv, sh.err = serveShare(ctx, a, k, sh.guest) })
		if sh.err != nil {
			s.mu.Lock()
			if s.byKey[k] == sh {
				delete(s.byKey, k)
			}
			s.mu.Unlock()
			return sh.err
		}
	}
	return nil
}

func serveShare(ctx context.Context, a *agent.Client, k shareKey, guest string) (*share.Server, error) {
	// The helper enforces the access; the guest's file system is
	// read-only only when nothing under it may be written: a bind's ro
	// is the guest's mount's, and the spec's mounts under it are binds
	// of their own there (binds.translate).
	g, err := a.OpenShare(ctx, guest, k.access == share.RecursiveReadOnly)
	if err != nil {
		return nil, fmt.Errorf("share %s: %w", k.host, err)
	}
	srv, err := share.Serve(ctx, g, k.host, k.access)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("share %s: %w", k.host, err), g.Close(ctx))
	}
	log.G(ctx).WithField("dir", k.host).WithField("guest", guest).Debug("directory shared with the VM")
	return srv, nil
}

// serving says whether the VM has shares.
func (s *vmShares) serving() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byKey) > 0
}

// close ends every share: the host's side, which is what could leak; the
// guest's unmount fails when the VM stopped first (the sandbox API stops
// it before the sandbox's guest closes), and goes with the VM anyway.
func (s *vmShares) close(ctx context.Context) {
	s.mu.Lock()
	all := s.byKey
	s.byKey = map[shareKey]*dirShare{}
	s.mu.Unlock()
	for _, sh := range all {
		// Waits for an open in progress, and stops one to come.
		sh.once.Do(func() { sh.err = errSharesClosed })
		if sh.srv == nil {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, shareCloseTimeout)
		if err := sh.srv.Close(cctx); err != nil {
			log.G(ctx).WithError(err).WithField("dir", sh.srv.Dir).Debug("share not unmounted in the guest")
		}
		cancel()
	}
}
