package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/containerd/v2/plugins"
	"github.com/containerd/log"
	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"
	"golang.org/x/sys/unix"
)

// socketFD is where pkg/shim finds the task socket it serves: the launcher
// (or a spare's claim) puts it there.
const socketFD = 3

// registerSocketUnlink makes the server remove its socket's path as its
// shutdown begins. A shutdown can take a while (VMs destroyed, spares'
// refill settled) and the socket accepts until the process ends, so
// `shim delete`, which containerd runs as soon as it lets go of the
// connection, would find it live and keep it, and a new task of the same
// group would be handed this dying server. pkg/shim's own clean-up at exit
// looks for the socket in containerd's default socket dir only.
//
// It is a TTRPC plugin, of the connection's kind, that serves no service:
// a plugin may not require its own type, and it needs the shutdown one.
func registerSocketUnlink() {
	registry.Register(&plugin.Registration{
		Type:     plugins.TTRPCPlugin,
		ID:       "socket-unlink",
		Requires: []plugin.Type{plugins.InternalPlugin},
		InitFn: func(ic *plugin.InitContext) (any, error) {
			path, err := servedPath(socketFD)
			if err != nil {
				return nil, plugin.ErrSkipPlugin
			}
			ss, err := ic.GetByID(plugins.InternalPlugin, "shutdown")
			if err != nil {
				return nil, err
			}
			unlinkOnShutdown(ic.Context, ss.(shutdown.Service), path)
			return path, nil
		},
	})
}

// servedPath is the path the listening unix socket at fd is bound to.
func servedPath(fd int) (string, error) {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return "", fmt.Errorf("name the socket at fd %d: %w", fd, err)
	}
	if u, ok := sa.(*unix.SockaddrUnix); ok && u.Name != "" && u.Name[0] != '@' {
		return u.Name, nil
	}
	return "", fmt.Errorf("fd %d is not a unix socket bound to a path", fd)
}

// unlinkOnShutdown removes path when sd's shutdown begins. While this
// server listens nobody else binds the path (the launcher keeps a socket
// that accepts), so the path is still this server's own. A failure is only
// logged: a callback's error would cut the other callbacks short.
func unlinkOnShutdown(ctx context.Context, sd shutdown.Service, path string) {
	sd.RegisterCallback(func(context.Context) error {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			log.G(ctx).WithError(err).WithField("path", path).Warn("remove the shim socket")
		}
		return nil
	})
}
