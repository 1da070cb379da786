// Package share serves a host directory to a VM's guest, live, as runc's
// bind mount shows it to a container: the guest's agent mounts a FUSE file
// system (agent.Share) and relays its kernel's requests; a helper process
// of this binary (Argv0), confined to the directory, answers them with
// go-fuse's loopback file system over a socket; the shim carries the
// messages between the two. What the container writes is on the host at
// once, and what the host changes (a mount under the directory too) shows
// in the guest.
package share

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// exitWait bounds the wait for the helper to end once its connection
// closed; it is killed past it.
const exitWait = 2 * time.Second

// Guest is the guest's end of one share (agent.Share).
type Guest interface {
	Read(ctx context.Context) (reqs [][]byte, eof bool, err error)
	Write(ctx context.Context, replies [][]byte) error
	Close(ctx context.Context) error
}

// Access is what a share lets the guest change in the directory.
type Access int

const (
	ReadWrite Access = iota
	// ReadOnly: not the directory's own file system; the mounts under it
	// as they are (a bind's "ro", which is not recursive).
	ReadOnly
	// RecursiveReadOnly: nothing ("rro").
	RecursiveReadOnly
)

var accessArgs = map[Access]string{ReadOnly: "ro", RecursiveReadOnly: "rro"}

// parseAccess is the Access of a helper's argument, -1 for none.
func parseAccess(arg string) Access {
	for a, s := range accessArgs {
		if s == arg {
			return a
		}
	}
	return -1
}

// Server is one directory served to one share in the guest.
type Server struct {
	Dir string

	guest  Guest
	helper *exec.Cmd
	exited chan struct{} // closed once the helper was reaped
	conn   int           // the shim's end of the helper's socket
	cancel context.CancelFunc
	pumps  sync.WaitGroup
	once   sync.Once
	err    error // Close's
}

// Serve starts serving host directory dir to guest, with access: a
// helper confined to dir, and the relay between the two, until Close.
func Serve(ctx context.Context, guest Guest, dir string, access Access) (*Server, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("serve %s: socketpair: %w", dir, err)
	}
	theirs := os.NewFile(uintptr(fds[1]), "share")
	defer theirs.Close()
	args := []string{dir}
	if a, ok := accessArgs[access]; ok {
		args = append(args, a)
	}
	// No Pdeathsig: it fires when the thread that forked ends, which a
	// Go thread does once a goroutine locked to it (in a network
	// namespace) returns. The helper ends when its socket does, with the
	// shim at the latest.
	helper := &exec.Cmd{Path: "/proc/self/exe", Args: append([]string{Argv0}, args...),
		ExtraFiles: []*os.File{theirs}, Stderr: logWriter{ctx: ctx, dir: dir},
		SysProcAttr: &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}}
	if err := helper.Start(); err != nil {
		unix.Close(fds[0])
		return nil, fmt.Errorf("serve %s: start the helper: %w", dir, err)
	}
	pctx, cancel := context.WithCancel(log.WithLogger(context.Background(), log.G(ctx)))
	s := &Server{Dir: dir, guest: guest, helper: helper, exited: make(chan struct{}), conn: fds[0], cancel: cancel}
	s.pumps.Add(2)
	go s.toHelper(pctx)
	go s.toGuest(pctx)
	go s.reap(pctx)
	return s, nil
}

// reap waits for the helper; one that ends before Close (killed, or its
// connection gone) closes the share, so that what the guest asks of it
// fails instead of waiting for an answer that cannot come.
func (s *Server) reap(ctx context.Context) {
	err := s.helper.Wait()
	close(s.exited)
	if ctx.Err() == nil {
		log.G(ctx).WithError(err).WithField("dir", s.Dir).Warn("a share's helper ended: closing the share")
		cctx, cancel := context.WithTimeout(context.Background(), exitWait)
		defer cancel()
		_ = s.Close(cctx)
	}
}

// toHelper carries the guest kernel's requests to the helper until the
// guest's file system is gone, then ends the helper's connection.
func (s *Server) toHelper(ctx context.Context) {
	defer s.pumps.Done()
	defer unix.Shutdown(s.conn, unix.SHUT_WR)
	for {
		reqs, eof, err := s.guest.Read(ctx)
		if err != nil {
			if ctx.Err() == nil {
				log.G(ctx).WithError(err).WithField("dir", s.Dir).Debug("share ended")
			}
			return
		}
		for _, r := range reqs {
			if _, err := unix.Write(s.conn, r); err != nil {
				return
			}
		}
		if eof {
			return
		}
	}
}

// toGuest carries the helper's replies to the guest, with those ready
// at once in the same call.
func (s *Server) toGuest(ctx context.Context) {
	defer s.pumps.Done()
	buf := make([]byte, api.MaxShareMsg)
	for {
		n, err := unix.Read(s.conn, buf)
		if err != nil && errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n == 0 {
			return
		}
		replies, total := [][]byte{append([]byte(nil), buf[:n]...)}, n
		for total+api.MaxShareMsg <= api.MaxShareBatch {
			n, _, err := unix.Recvfrom(s.conn, buf, unix.MSG_DONTWAIT)
			if err != nil || n == 0 {
				break
			}
			replies, total = append(replies, append([]byte(nil), buf[:n]...)), total+n
		}
		if err := s.guest.Write(ctx, replies); err != nil {
			if ctx.Err() == nil {
				log.G(ctx).WithError(err).WithField("dir", s.Dir).Debug("share reply not delivered")
			}
			return
		}
	}
}

// Close ends the relay and the helper (killed if it does not end on its
// own), then unmounts the share in the guest, which fails what the guest
// still asks of it.
func (s *Server) Close(ctx context.Context) error {
	s.once.Do(func() {
		s.cancel()
		_ = unix.Shutdown(s.conn, unix.SHUT_RDWR)
		s.pumps.Wait()
		unix.Close(s.conn)
		select {
		case <-s.exited:
		case <-time.After(exitWait):
			_ = s.helper.Process.Kill()
			<-s.exited
		}
		s.err = s.guest.Close(ctx)
	})
	return s.err
}

// logWriter logs what the helper writes to its stderr.
type logWriter struct {
	ctx context.Context
	dir string
}

func (w logWriter) Write(p []byte) (int, error) {
	log.G(w.ctx).WithField("dir", w.dir).Warn(string(p))
	return len(p), nil
}
