package agent

import (
	"context"
	"fmt"
	"io/fs"
	"net"
	"path/filepath"
	"slices"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/pause"
)

// InitRequest is what a restored clone gets after every restore: its own
// identity, its files, its network and its container root.
type InitRequest struct {
	Time     time.Time // the guest's wall clock; zero leaves it
	Entropy  []byte    // mixed into the guest's pool, then the CRNG is reseeded
	Hostname string    // empty leaves it
	// Files are made in the guest before the network and the rootfs:
	// /etc/resolv.conf, /etc/hosts, /etc/hostname without a rootfs, the
	// copies of its bind mounts' sources with one. What one request cannot
	// carry (api.MaxFiles entries; files of api.MaxFileSize bytes,
	// api.MaxFilesSize in all) is sent first with UpdateFiles, so must be
	// under the guest's copies of bind sources.
	Files []File
	// Network configures the guest's NIC; nil sets it down with no
	// addresses or routes.
	Network *Network
	// Rootfs mounts the container's root; nil runs processes in the guest's
	// own root. A guest keeps the rootfs it got first until it reboots.
	Rootfs *Rootfs
	// Process, when set, is prepared last, in the root, for Start: the
	// guest creates it with its stdio and all it runs with, and runs its
	// program only at Start, as runc does between create and start. An
	// agent older than API 3 ignores it: Prepared then says so, and the
	// process is Exec'd instead.
	Process *ExecRequest
	// Sysctls are set in the guest's own namespaces, by their dotted
	// names, after the hostname; at most api.MaxSysctls. They need API 6.
	Sysctls map[string]string
	// WarmContainers says the VM will host containers (a pod's VM): once
	// Init is done the guest's runc creates and deletes a throwaway
	// container at idle priority, while the host prepares the first
	// container. Agents before API 11 ignore it, which costs only the
	// warm-up.
	WarmContainers bool
	// WarmOwnInit warms the guest's own container init rather than its
	// runc (agent API 14), for containers made with OwnInit.
	WarmOwnInit bool
}

// File is a file, a directory or a symbolic link to make in the guest.
type File struct {
	Path string // absolute
	Data []byte // a file's content, a link's target, nothing for a directory
	// Mode is the permission bits (0 means 0644 for a file, 0755 for a
	// directory), with fs.ModeDir for a directory or fs.ModeSymlink for a
	// link. An agent older than directories and links refuses them.
	Mode fs.FileMode
	// TmpfsSize, for a directory, makes it a tmpfs of that many bytes
	// (agent API 8): the copy of a host tmpfs keeps its size limit.
	TmpfsSize int64
}

// tmpfsIn says whether a file of files is a tmpfs, which needs agent API 8.
func tmpfsIn(files []File) bool {
	return slices.ContainsFunc(files, func(f File) bool { return f.TmpfsSize > 0 })
}

// tmpfsNeeds is what tmpfsIn asks of the agent, for requireVersion.
const tmpfsNeeds = "a directory that is a tmpfs of its own (a memory-backed emptyDir's size limit)"

// Network is the configuration of the guest's NIC, as the task's network
// namespace interface has it.
type Network struct {
	MAC       net.HardwareAddr // nil keeps the NIC's
	MTU       int              // 0 keeps the NIC's
	Addresses []net.IPNet      // IPv4 and IPv6 addresses with their prefix lengths
	Routes    []Route
}

// Route is a route through the guest's NIC.
type Route struct {
	Dst     *net.IPNet // nil: the default route of Gateway's family
	Gateway net.IP     // nil: the destination is on the link
	Source  net.IP     // nil lets the guest kernel choose
	Metric  uint32
	OnLink  bool // the gateway is on the link though no address covers it
}

// Rootfs is the container's root: a read-only file system on the virtio-blk
// disk whose serial is Serial, under a private writable overlay, with the
// OCI spec's mounts inside it. Without a serial (nor type or mounts) it is
// the guest's own root, a snapshot image's, confined for the processes
// (agent API 10): they run in a mount namespace of their own where it is.
type Rootfs struct {
	FSType string // "erofs" or "ext4"
	Serial string
	// Size is the image's size in bytes; 0 if unknown, which has the guest
	// probe the disk again (see api.Rootfs.size).
	Size   uint64
	Mounts []specs.Mount
	// The spec's confinement of the root, applied after the mounts.
	MaskedPaths, ReadonlyPaths []string
	Readonly                   bool
}

// confined says whether r asks for what agents before API 7 ignore.
func (r *Rootfs) confined() bool {
	return r != nil && (r.Readonly || len(r.MaskedPaths) > 0 || len(r.ReadonlyPaths) > 0)
}

// Init gives the clone its identity, files, network and root, and
// prepares its process; call it after every restore. The guest applies
// them in that order and names the step that failed; it times those it
// had work for, the phases returned (none from an older agent, or from
// one whose phases are not believable: see guestPhases).
//
// It is the first call after a restore: an agent of API 3 or later says
// its version in its answer. An older one says nothing, so only then does
// Init ask it (a Ping), to fail if it ignored what it does not know.
func (c *Client) Init(ctx context.Context, r InitRequest) ([]Phase, error) {
	var err error
	if r.Files, err = c.sendAhead(ctx, r.Files); err != nil {
		return nil, fmt.Errorf("init guest: %w", err)
	}
	req, err := initRequest(r)
	if err != nil {
		return nil, fmt.Errorf("init guest: %w", err)
	}
	needs2 := len(r.Files) > 0 || r.Network != nil || r.Rootfs != nil
	if needs2 && c.knownVersion() != 0 {
		if err := c.requireVersion(ctx, apiVersion2, "files, a network or a rootfs"); err != nil {
			return nil, fmt.Errorf("init guest: %w", err)
		}
	}
	began := time.Now()
	resp, err := c.api.Init(ctx, req)
	call := time.Since(began)
	if err != nil {
		if perr := c.pauseNeeds(ctx, r.Process); perr != nil {
			err = perr
		}
		return nil, fmt.Errorf("init guest: %w", native(err))
	}
	if resp.GetVersion() != "" {
		c.setVersion(resp.GetVersion())
	} else if needs2 {
		if err := c.requireVersion(ctx, apiVersion2, "files, a network or a rootfs"); err != nil {
			return nil, fmt.Errorf("init guest: %w", err)
		}
	}
	for _, n := range initNeeds(r) {
		if err := c.requireVersion(ctx, n.version, n.what); err != nil {
			return nil, fmt.Errorf("init guest: %w", err)
		}
	}
	if r.Process != nil && c.knownVersion() >= apiVersion3 {
		c.mu.Lock()
		c.prepared[r.Process.ID] = ExecRequest{ID: r.Process.ID, Terminal: r.Process.Terminal, Stdin: r.Process.Stdin}
		c.mu.Unlock()
	}
	return guestPhases(resp.GetPhases(), api.InitPhases, call), nil
}

// need is what a request asks of the agent's API, and the version that
// brought it.
type need struct {
	version int
	what    string
}

// initNeeds are what r asks beyond API 2 (checked apart: before the call
// when the version is known).
func initNeeds(r InitRequest) []need {
	var out []need
	p := r.Process
	if p != nil && p.OwnPIDNamespace {
		out = append(out, need{apiVersion5, "a process in a PID namespace of its own"})
	}
	if len(r.Sysctls) > 0 {
		out = append(out, need{apiVersion6, "sysctls"})
	}
	if tmpfsIn(r.Files) {
		out = append(out, need{apiVersion8, tmpfsNeeds})
	}
	if p != nil && p.Capabilities != nil {
		out = append(out, need{apiVersion7, "a process's capabilities"})
	}
	if p != nil && p.Seccomp != nil {
		out = append(out, need{apiVersion10, "a seccomp filter"})
	}
	if r.Rootfs.confined() {
		out = append(out, need{apiVersion7, "a read-only root, masked or read-only paths"})
	}
	if r.Rootfs != nil && r.Rootfs.Serial == "" {
		out = append(out, need{apiVersion10, "a confined root for a snapshot image"})
	}
	return out
}

// pauseNeeds says, after an Init failed, whether it failed because p is
// the guest's own pause and the guest predates it (its program is then
// missing; the version error replaces that one): asked only then, so a
// pod's start pays no Ping for it.
func (c *Client) pauseNeeds(ctx context.Context, p *ExecRequest) error {
	if p == nil || len(p.Args) == 0 || p.Args[0] != pause.Path {
		return nil
	}
	return c.requireVersion(ctx, apiVersion12, "the guest's own pause process")
}

func initRequest(r InitRequest) (*api.InitRequest, error) {
	if len(r.Sysctls) > api.MaxSysctls {
		return nil, fmt.Errorf("%d sysctls, expected at most %d: %w", len(r.Sysctls), api.MaxSysctls, errdefs.ErrInvalidArgument)
	}
	req := &api.InitRequest{Entropy: r.Entropy, Hostname: r.Hostname, Sysctls: r.Sysctls, WarmContainers: r.WarmContainers, WarmOwnInit: r.WarmOwnInit}
	if !r.Time.IsZero() {
		req.Time = timestamppb.New(r.Time)
	}
	files, err := initFiles(r.Files)
	if err != nil {
		return nil, err
	}
	req.Files = files
	if r.Network != nil {
		req.Network = initNetwork(r.Network)
	}
	if r.Rootfs != nil {
		if req.Rootfs, err = initRootfs(r.Rootfs); err != nil {
			return nil, err
		}
	}
	if r.Process != nil {
		if req.Process, err = execRequest(*r.Process); err != nil {
			return nil, err
		}
	}
	return req, nil
}

func initFiles(files []File) ([]*api.File, error) {
	if len(files) > api.MaxFiles {
		return nil, fmt.Errorf("%d files, expected at most %d: %w", len(files), api.MaxFiles, errdefs.ErrInvalidArgument)
	}
	var out []*api.File
	total := 0
	for _, f := range files {
		if len(f.Data) > api.MaxFileSize {
			return nil, fmt.Errorf("file %q: %d bytes, expected at most %d: %w", f.Path, len(f.Data), api.MaxFileSize, errdefs.ErrInvalidArgument)
		}
		af, err := apiFile(f)
		if err != nil {
			return nil, err
		}
		total += len(f.Data)
		out = append(out, af)
	}
	if total > api.MaxFilesSize {
		return nil, fmt.Errorf("files hold %d bytes, expected at most %d: %w", total, api.MaxFilesSize, errdefs.ErrInvalidArgument)
	}
	return out, nil
}

// apiFile is f as the agent takes it, its path absolute.
func apiFile(f File) (*api.File, error) {
	if !filepath.IsAbs(f.Path) {
		return nil, fmt.Errorf("file %q: expected an absolute path: %w", f.Path, errdefs.ErrInvalidArgument)
	}
	mode, err := fileMode(f)
	if err != nil {
		return nil, err
	}
	if f.TmpfsSize < 0 {
		return nil, fmt.Errorf("file %q: tmpfs size %d, expected none or a positive size: %w", f.Path, f.TmpfsSize, errdefs.ErrInvalidArgument)
	}
	return &api.File{Path: f.Path, Data: f.Data, Mode: mode, TmpfsSize: uint64(f.TmpfsSize)}, nil
}

// fileMode is f's mode as stat(2) encodes it: the type bits of a
// directory or a link, none for a regular file (as agents before API 4
// expect).
func fileMode(f File) (uint32, error) {
	perm := uint32(f.Mode.Perm())
	switch {
	case f.Mode&^fs.ModePerm == 0:
		return perm, nil
	case f.Mode&^fs.ModePerm == fs.ModeDir && len(f.Data) == 0:
		return unix.S_IFDIR | perm, nil
	case f.Mode&^fs.ModePerm == fs.ModeSymlink && len(f.Data) > 0:
		return unix.S_IFLNK | perm, nil
	}
	return 0, fmt.Errorf("file %q: mode %v with %d bytes, expected a file, an empty directory's mode or a link with its target: %w", f.Path, f.Mode, len(f.Data), errdefs.ErrInvalidArgument)
}

func initNetwork(n *Network) *api.Network {
	out := &api.Network{Mtu: uint32(n.MTU)}
	if len(n.MAC) > 0 {
		out.Mac = n.MAC.String()
	}
	for _, a := range n.Addresses {
		out.Addresses = append(out.Addresses, a.String())
	}
	for _, r := range n.Routes {
		ar := &api.Route{Metric: r.Metric, OnLink: r.OnLink}
		if r.Dst != nil {
			ar.Destination = r.Dst.String()
		}
		if r.Gateway != nil {
			ar.Gateway = r.Gateway.String()
		}
		if r.Source != nil {
			ar.Source = r.Source.String()
		}
		out.Routes = append(out.Routes, ar)
	}
	return out
}

func initRootfs(r *Rootfs) (*api.Rootfs, error) {
	out := &api.Rootfs{Fstype: r.FSType, Serial: r.Serial, Size: r.Size, MaskedPaths: r.MaskedPaths, ReadonlyPaths: r.ReadonlyPaths, Readonly: r.Readonly}
	for _, m := range r.Mounts {
		if len(m.UIDMappings) > 0 || len(m.GIDMappings) > 0 {
			return nil, fmt.Errorf("mount at %q: id-mapped mounts are not supported in the guest: %w", m.Destination, errdefs.ErrInvalidArgument)
		}
		out.Mounts = append(out.Mounts, &api.Mount{
			Destination: m.Destination, Type: m.Type, Source: m.Source, Options: m.Options,
		})
	}
	return out, nil
}
