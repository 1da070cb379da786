package vm

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/containerd/log"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/network"
)

// portForward carries kubectl port-forward into the VM: containerd's CRI
// dials localhost:PORT inside the pod's network namespace, where the
// namespace's loopback listener takes the connection, and the guest agent
// connects to PORT on the guest's loopback; the bytes go between the two.
// A port nothing in the guest listens on resets the connection at once.
type portForward struct {
	id          string
	ln          *network.LoopbackListener
	agent       *agent.Client
	callTimeout time.Duration
	slots       chan struct{} // bounds the connections relayed at once

	ctx    context.Context // ends every relay
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func startPortForward(ctx context.Context, id string, ns *network.Namespace, c *agent.Client, callTimeout time.Duration) (*portForward, error) {
	ln, err := ns.ListenLoopback()
	if err != nil {
		return nil, err
	}
	f := &portForward{id: id, ln: ln, agent: c, callTimeout: callTimeout, slots: make(chan struct{}, api.MaxPortConns)}
	f.ctx, f.cancel = context.WithCancel(ctx)
	f.wg.Add(1)
	go f.serve()
	return f, nil
}

func (f *portForward) serve() {
	defer f.wg.Done()
	for {
		conn, port, err := f.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				log.G(f.ctx).WithError(err).WithField("id", f.id).Warn("port-forward listener failed")
			}
			return
		}
		select {
		case f.slots <- struct{}{}:
		default:
			reset(conn) // the agent would refuse it anyway
			continue
		}
		f.wg.Add(1)
		go func() {
			defer func() { <-f.slots; f.wg.Done() }()
			f.relay(conn, port)
		}()
	}
}

// relay joins conn to port in the guest until both sides have ended, or
// the forward stops.
func (f *portForward) relay(conn *net.TCPConn, port uint16) {
	ctx, cancel := context.WithTimeout(f.ctx, f.callTimeout)
	guest, err := f.agent.DialPort(ctx, port)
	cancel()
	if err != nil {
		log.G(f.ctx).WithError(err).WithFields(log.Fields{"id": f.id, "port": port}).Info("port-forward refused")
		reset(conn)
		return
	}
	stop := context.AfterFunc(f.ctx, func() { conn.Close(); guest.Close() })
	defer stop()
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(guest, conn)
		_ = guest.CloseWrite()
		close(done)
	}()
	_, _ = io.Copy(conn, guest)
	_ = conn.CloseWrite()
	<-done
	conn.Close()
	guest.Close()
}

// reset closes conn with a RST: the client's connection fails at once,
// as a dial to a port nothing listens on would.
func reset(conn *net.TCPConn) {
	_ = conn.SetLinger(0)
	_ = conn.Close()
}

// stop ends the listener and every relay, and waits for them.
func (f *portForward) stop() error {
	if f == nil {
		return nil
	}
	err := f.ln.Close()
	f.cancel()
	f.wg.Wait()
	return err
}
