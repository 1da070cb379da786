// Command cocoon-agent is the guest agent: it runs inside every cocoon VM
// (started by the guest's init) and serves the agent API to the host over
// the virtio-serial port named "agent" and, when the VM has one, AF_VSOCK.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/server"
)

const (
	portName = "agent"
	// portWait bounds the wait for the port's name, which the device
	// announces shortly after the virtio_console module loads.
	portWait = 10 * time.Second
	// startedMarker, in the agent's state dir (a tmpfs), says an agent
	// started since the guest booted.
	startedMarker = "agent.started"
)

func main() {
	if err := run(); err != nil {
		log.L.WithError(err).Error("cocoon-agent failed")
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), unix.SIGTERM, unix.SIGINT)
	defer stop()
	listeners := openListeners(ctx)
	if len(listeners) == 0 {
		// Exiting would only make init respawn the agent in a tight loop.
		err := fmt.Errorf("no transport: neither a virtio-serial port named %q nor a vsock device", portName)
		log.G(ctx).WithError(err).Error("nothing to serve; waiting for shutdown")
		<-ctx.Done()
		return err
	}
	opts := []server.Option{server.WithNetwork(server.Netlink{}), server.WithMounter(server.LinuxMounts{})}
	if firstStart() {
		opts = append(opts, server.WithFreshBoot())
	}
	svc := server.New(server.Linux{}, opts...)
	srv, err := server.NewTTRPCServer(svc)
	if err != nil {
		return err
	}
	defer srv.Close()
	errc := make(chan error, len(listeners))
	for _, l := range listeners {
		go func() { errc <- srv.Serve(ctx, l) }()
	}
	log.G(ctx).WithField("version", server.Version).Info("cocoon-agent serving")
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	}
}

// firstStart says whether the agent starts for the first time since the
// guest booted (init restarts it if it dies): only then is the NIC as the
// boot left it, down and bare.
func firstStart() bool {
	if err := os.MkdirAll(server.DefaultStateDir, 0o755); err != nil {
		return false
	}
	f, err := os.OpenFile(filepath.Join(server.DefaultStateDir, startedMarker), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

func openListeners(ctx context.Context) []net.Listener {
	var ls []net.Listener
	if path, err := waitSerialPort(ctx); err != nil {
		log.G(ctx).WithError(err).Warn("no virtio-serial transport")
	} else if port, err := server.OpenSerialPort(path); err != nil {
		log.G(ctx).WithError(err).Warn("no virtio-serial transport")
	} else {
		log.G(ctx).WithField("port", path).Info("listening on virtio-serial")
		ls = append(ls, agent.ListenSerial(port))
	}
	if l, err := server.ListenVsock(agent.VsockPort); err != nil {
		log.G(ctx).WithError(err).Info("no vsock transport")
	} else {
		log.G(ctx).WithField("port", agent.VsockPort).Info("listening on vsock")
		ls = append(ls, l)
	}
	return ls
}

// waitSerialPort finds the agent port, giving the ports a moment to learn
// their names when there are any.
func waitSerialPort(ctx context.Context) (string, error) {
	deadline := time.Now().Add(portWait)
	for {
		path, err := server.FindSerialPort(portName)
		if err == nil || !errors.Is(err, server.ErrPortNotNamed) || time.Now().After(deadline) {
			return path, err
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
