// Package agent is cocoon's host<->guest protocol: the ttrpc client the shim
// uses, the stream transports that carry it, and the session framing the
// guest server shares over virtio-serial.
package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/ttrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sync/semaphore"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// VsockPort is the AF_VSOCK port the guest agent listens on.
const VsockPort = 1024

// Client talks to one guest agent.
type Client struct {
	conn net.Conn
	tc   *ttrpc.Client
	api  api.AgentService

	// portBytes bounds the port-forward data in flight to the guest, so
	// that many connections at once never fill the send queue (maxQueued),
	// which would take the guest for one that stopped reading.
	portBytes *semaphore.Weighted

	mu       sync.Mutex
	prepared map[string]ExecRequest // processes Init prepared, until Start starts them
	version  int                    // the agent's API version, once a Ping or Init told it
}

// NewClient speaks the agent API over conn, a stream from DialUnix or
// DialHybridVsock. Writes to the guest are queued, so a guest that stops
// reading blocks no call beyond its context, and replies that answer no
// request are dropped before ttrpc sees (and logs) them.
func NewClient(conn net.Conn) *Client {
	tc := ttrpc.NewClient(newReplyFilter(newSendQueue(conn)))
	return &Client{conn: conn, tc: tc, api: api.NewAgentClient(tc), portBytes: semaphore.NewWeighted(maxPortInFlight),
		prepared: map[string]ExecRequest{}}
}

// Accepted waits until the guest agent accepted the client's session,
// which a dial on an Eager context did not wait for; at once otherwise.
func (c *Client) Accepted(ctx context.Context) error {
	return accepted(ctx, c.conn)
}

// native turns the guest's status errors back into containerd errdefs
// errors, so callers can test them with errdefs.IsNotFound and friends.
// Other errors (a closed connection, an ended context) pass unchanged.
func native(err error) error {
	if _, ok := status.FromError(err); ok {
		return errgrpc.ToNative(err)
	}
	return err
}

// Close closes the connection at once; calls in flight fail. It never
// waits for the guest: what a stuck guest left unread is dropped.
func (c *Client) Close() error {
	return c.tc.Close()
}

// Ping returns once the agent serves.
func (c *Client) Ping(ctx context.Context) error {
	resp, err := c.api.Ping(ctx, &emptypb.Empty{})
	if err != nil {
		return fmt.Errorf("ping guest agent: %w", native(err))
	}
	c.setVersion(resp.Version)
	return nil
}

func (c *Client) setVersion(version string) {
	v, _ := strconv.Atoi(version)
	c.mu.Lock()
	c.version = v
	c.mu.Unlock()
}

// knownVersion is the agent's API version, 0 until a Ping or Init told it.
func (c *Client) knownVersion() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.version
}

const (
	// apiVersion2 is the first agent API with Init's files, network and
	// rootfs and Exec's rlimits, umask and no_new_privileges.
	apiVersion2 = 2
	// apiVersion3 is the first whose Init prepares a process for Start
	// and tells the agent's version.
	apiVersion3 = 3
	// apiVersion5 is the first that starts a process in a PID namespace
	// of its own.
	apiVersion5 = 5
	// apiVersion6 is the first whose Init sets sysctls.
	apiVersion6 = 6
	// apiVersion7 is the first with the port calls and UpdateFiles.
	apiVersion7 = 7
	// apiVersion10 is the first that starts a process under a seccomp
	// filter.
	apiVersion10 = 10
	// apiVersion12 is the first whose guest has its own pause process.
	apiVersion12 = 12
	// apiVersion15 is the first whose pause exits at once given
	// pause.WarmFlag.
	apiVersion15 = 15
)

// WarmsPause says whether the guest's pause takes pause.WarmFlag (an
// older one would wait for a signal).
func (c *Client) WarmsPause(ctx context.Context) (bool, error) {
	have, err := c.apiVersion(ctx)
	return have >= apiVersion15, err
}

// apiVersion is the agent's API version, asked with a Ping if no answer
// said it yet.
func (c *Client) apiVersion(ctx context.Context) (int, error) {
	if have := c.knownVersion(); have != 0 {
		return have, nil
	}
	if err := c.Ping(ctx); err != nil {
		return 0, err
	}
	return c.knownVersion(), nil
}

// requireVersion fails unless the agent speaks API version v: an older one
// (in a snapshot baked before it) would drop the fields that what names
// and succeed without them.
func (c *Client) requireVersion(ctx context.Context, v int, what string) error {
	have, err := c.apiVersion(ctx)
	if err != nil {
		return err
	}
	if have < v {
		return fmt.Errorf("%s needs guest agent API %d, the guest's agent speaks %d (rebuild the snapshot): %w", what, v, have, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// ExecRequest describes a process to start in the guest.
type ExecRequest struct {
	ID             string
	Args, Env      []string
	Cwd            string
	UID, GID       uint32
	AdditionalGIDs []uint32
	Terminal       bool
	Stdin          bool // the process gets a stdin stream (else /dev/null)
	// Rlimits, NoNewPrivileges and Umask apply to the process only.
	Rlimits         []specs.POSIXRlimit
	NoNewPrivileges bool
	Umask           *uint32 // nil inherits the agent's
	// OwnPIDNamespace makes the process pid 1 of a PID namespace of its
	// own (a pod's pause process, which the pod's containers share).
	OwnPIDNamespace bool
	// Capabilities, when set, are the process's (agent API 7).
	Capabilities *specs.LinuxCapabilities
	// Seccomp, when set, is the filter the process starts under (agent
	// API 10): its container's linux.seccomp.
	Seccomp *specs.LinuxSeccomp
}

// Exec starts a process in the guest. After an Init with a rootfs, the
// process runs in the container's root.
func (c *Client) Exec(ctx context.Context, r ExecRequest) (*Process, error) {
	if len(r.Rlimits) > 0 || r.Umask != nil || r.NoNewPrivileges {
		if err := c.requireVersion(ctx, apiVersion2, "rlimits, a umask or no_new_privileges"); err != nil {
			return nil, fmt.Errorf("exec %q in guest: %w", r.ID, err)
		}
	}
	if r.OwnPIDNamespace {
		if err := c.requireVersion(ctx, apiVersion5, "a PID namespace of its own"); err != nil {
			return nil, fmt.Errorf("exec %q in guest: %w", r.ID, err)
		}
	}
	if r.Capabilities != nil {
		if err := c.requireVersion(ctx, apiVersion7, "a process's capabilities"); err != nil {
			return nil, fmt.Errorf("exec %q in guest: %w", r.ID, err)
		}
	}
	if r.Seccomp != nil {
		if err := c.requireVersion(ctx, apiVersion10, "a seccomp filter"); err != nil {
			return nil, fmt.Errorf("exec %q in guest: %w", r.ID, err)
		}
	}
	req, err := execRequest(r)
	if err != nil {
		return nil, fmt.Errorf("exec %q in guest: %w", r.ID, err)
	}
	resp, err := c.api.Exec(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("exec %q in guest: %w", r.ID, native(err))
	}
	return c.process(r, resp.GetPid()), nil
}

func execRequest(r ExecRequest) (*api.ExecRequest, error) {
	req := &api.ExecRequest{
		Id: r.ID, Args: r.Args, Env: r.Env, Cwd: r.Cwd,
		Uid: r.UID, Gid: r.GID, AdditionalGids: r.AdditionalGIDs,
		Terminal: r.Terminal, Stdin: r.Stdin,
		NoNewPrivileges: r.NoNewPrivileges, Umask: r.Umask, OwnPidNamespace: r.OwnPIDNamespace,
	}
	for _, l := range r.Rlimits {
		req.Rlimits = append(req.Rlimits, &api.Rlimit{Type: l.Type, Soft: l.Soft, Hard: l.Hard})
	}
	if c := r.Capabilities; c != nil {
		req.Capabilities = &api.Capabilities{Bounding: c.Bounding, Effective: c.Effective,
			Permitted: c.Permitted, Inheritable: c.Inheritable, Ambient: c.Ambient}
	}
	if r.Seccomp != nil {
		var err error
		if req.Seccomp, err = json.Marshal(r.Seccomp); err != nil {
			return nil, fmt.Errorf("encode seccomp profile: %w", err)
		}
	}
	return req, nil
}

// Prepared says whether Init prepared process id for Start on this client.
func (c *Client) Prepared(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.prepared[id]
	return ok
}

// Start starts process id, which Init prepared.
func (c *Client) Start(ctx context.Context, id string) (*Process, error) {
	c.mu.Lock()
	r, ok := c.prepared[id]
	c.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("start %q in guest: Init prepared no such process on this client: %w", id, errdefs.ErrNotFound)
	}
	resp, err := c.api.Start(ctx, &api.ProcessRequest{Id: id})
	if err != nil {
		return nil, fmt.Errorf("start %q in guest: %w", id, native(err))
	}
	c.mu.Lock()
	delete(c.prepared, id)
	c.mu.Unlock()
	return c.process(r, resp.GetPid()), nil
}

// ExitStatus is how a guest process ended.
type ExitStatus struct {
	Code     int // 128+Signal when killed by a signal
	Signal   int // 0 when the process exited normally
	ExitedAt time.Time
}

// Wait blocks until process id exits.
func (c *Client) Wait(ctx context.Context, id string) (ExitStatus, error) {
	resp, err := c.api.Wait(ctx, &api.ProcessRequest{Id: id})
	if err != nil {
		return ExitStatus{}, fmt.Errorf("wait for %q in guest: %w", id, native(err))
	}
	return ExitStatus{
		Code:     int(resp.ExitCode),
		Signal:   int(resp.Signal),
		ExitedAt: resp.ExitedAt.AsTime(),
	}, nil
}

// Signal sends sig to process id; errdefs.ErrNotFound if it has exited.
func (c *Client) Signal(ctx context.Context, id string, sig syscall.Signal) error {
	if _, err := c.api.Signal(ctx, &api.SignalRequest{Id: id, Signal: uint32(sig)}); err != nil {
		return fmt.Errorf("signal %q in guest: %w", id, native(err))
	}
	return nil
}

// ResizePty sets the terminal size of process id.
func (c *Client) ResizePty(ctx context.Context, id string, width, height uint32) error {
	if _, err := c.api.ResizePty(ctx, &api.ResizePtyRequest{Id: id, Width: width, Height: height}); err != nil {
		return fmt.Errorf("resize pty of %q in guest: %w", id, native(err))
	}
	return nil
}

// CloseStdin ends the stdin of process id (on a terminal: sends end-of-file).
func (c *Client) CloseStdin(ctx context.Context, id string) error {
	if _, err := c.api.CloseStdin(ctx, &api.ProcessRequest{Id: id}); err != nil {
		return fmt.Errorf("close stdin of %q in guest: %w", id, native(err))
	}
	return nil
}

// Delete forgets an exited process; its id can then be used again.
func (c *Client) Delete(ctx context.Context, id string) error {
	if _, err := c.api.Delete(ctx, &api.ProcessRequest{Id: id}); err != nil {
		return fmt.Errorf("delete %q in guest: %w", id, native(err))
	}
	c.mu.Lock()
	delete(c.prepared, id)
	c.mu.Unlock()
	return nil
}

// Shutdown syncs the guest's file systems and powers it off. The guest may
// go away before it answers, so a dropped connection is success.
func (c *Client) Shutdown(ctx context.Context) error {
	_, err := c.api.Shutdown(ctx, &emptypb.Empty{})
	if err != nil && !isConnectionGone(err) {
		return fmt.Errorf("shut down guest: %w", native(err))
	}
	return nil
}
