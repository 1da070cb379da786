package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"time"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/contrib/snapshotservice"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/log"
	"google.golang.org/grpc"
)

// stopGrace bounds how long a shutdown waits for in-flight calls (a
// Prepare may be flattening a large chain) before cutting them off.
const stopGrace = 10 * time.Second

// Serve serves sn's containerd snapshots API over gRPC on the unix socket
// address until ctx is done, then stops and removes the socket. It refuses
// an address where another server still answers.
func Serve(ctx context.Context, sn snapshots.Snapshotter, address string) error {
	if err := os.MkdirAll(filepath.Dir(address), 0o700); err != nil {
		return fmt.Errorf("create socket dir: %w", err)
	}
	if err := removeStaleSocket(address); err != nil {
		return err
	}
	l, err := net.Listen("unix", address)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", address, err)
	}
	defer os.Remove(address)

	srv := grpc.NewServer()
	snapshotsapi.RegisterSnapshotsServer(srv, snapshotservice.FromSnapshotter(wire{sn}))
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	log.G(ctx).WithField("address", address).Info("serving snapshots API")

	select {
	case err := <-errc:
		return fmt.Errorf("serve %s: %w", address, err)
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(stopGrace):
		log.G(ctx).Warn("in-flight calls outlived the shutdown grace period; stopping them")
		srv.Stop()
		<-stopped
	}
	return nil
}

// removeStaleSocket removes a socket left by a dead server.
func removeStaleSocket(address string) error {
	fi, err := os.Lstat(address)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("check socket %s: %w", address, err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("socket address %s exists and is not a socket", address)
	}
	if c, err := net.DialTimeout("unix", address, time.Second); err == nil {
		c.Close()
		return fmt.Errorf("socket %s: another server is listening on it", address)
	}
	if err := os.Remove(address); err != nil {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	return nil
}
