package share

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// Argv0 is the name the shim server binary is executed under to serve one
// share: `Argv0 DIR [ro|rro]`, with the FUSE connection as file
// descriptor 3.
const Argv0 = "cocoon-share"

// connFD is the helper's end of the FUSE connection.
const connFD = 3

// Main serves the share its arguments name and exits when the connection
// ends.
func Main() {
	if err := serve(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", Argv0, err)
		os.Exit(1)
	}
}

// serve confines the process to the directory and serves it. The process
// runs in a mount namespace of its own (Start clones it so); there the
// host's mounts are made slaves, so a mount the host makes under the
// directory later still shows and none of the helper's leaks out, and the
// directory is bound onto itself nodev and nosuid (read-only too, and
// the mounts under it for a recursive one, as the share's access says),
// then made the root, the rest dropped: a guest's request names paths
// under it, and whatever links it made, it reaches nothing else, nor a
// device.
func serve(args []string) error {
	access := ReadWrite
	if len(args) == 2 {
		access = parseAccess(args[1])
	}
	if len(args) < 1 || len(args) > 2 || access < 0 {
		return fmt.Errorf("usage: %s DIR [ro|rro]", Argv0)
	}
	dir := args[0]
	if err := confine(dir, access); err != nil {
		return err
	}
	root, err := newRoot()
	if err != nil {
		return err
	}
	// go-fuse logs the connection's end as a failed read, with the
	// standard logger too; a handler's panic is what is worth saying.
	log.SetOutput(io.Discard)
	// The guest's kernel keeps names and attributes a second, as
	// virtio-fs's default does: a call into the guest costs a
	// millisecond or more, and ls -l would pay it for every file.
	cache := time.Second
	opts := &fs.Options{EntryTimeout: &cache, AttrTimeout: &cache, MountOptions: fuse.MountOptions{
		MaxWrite:      api.MaxShareWrite,
		DisableSplice: true,
		Name:          Argv0,
		Logger:        log.New(io.Discard, "", 0),
		PanicHandler: func(v any) fuse.Status {
			fmt.Fprintf(os.Stderr, "a request failed: panic: %v\n", v)
			return fuse.EIO
		},
	}}
	srv, err := fuse.NewServer(fs.NewNodeFS(root, opts), fmt.Sprintf("/dev/fd/%d", connFD), &opts.MountOptions)
	if err != nil {
		return fmt.Errorf("serve the share: %w", err)
	}
	srv.Serve()
	return nil
}

func confine(dir string, access Access) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make the host's mounts slaves: %w", err)
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", dir, err)
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_NODEV | unix.MS_NOSUID)
	if access != ReadWrite {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount("", dir, "", flags, ""); err != nil {
		return fmt.Errorf("remount %s nodev: %w", dir, err)
	}
	if access == RecursiveReadOnly {
		attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
		if err := unix.MountSetattr(unix.AT_FDCWD, dir, unix.AT_RECURSIVE, attr); err != nil {
			return fmt.Errorf("make %s and its mounts read-only: %w", dir, err)
		}
	}
	return enterRoot(dir)
}

// enterRoot makes the bind of dir the process's root and drops the rest:
// pivot_root(".", ".") stacks the old root on the new one and the detach
// lets it go, so the namespace holds nothing of the host's but the
// directory, and keeps no file system the host unmounts alive. Then the
// privileges that took go (dropPrivileges).
func enterRoot(dir string) error {
	if err := unix.Chdir(dir); err != nil {
		return fmt.Errorf("chdir to %s: %w", dir, err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root to %s: %w", dir, err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the host's root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("chdir to the share's root: %w", err)
	}
	return dropPrivileges()
}

// newRoot is go-fuse's loopback of "/" (the share, after confine), with
// the nodes of node.
func newRoot() (fs.InodeEmbedder, error) {
	root, err := fs.NewLoopbackRoot("/")
	if err != nil {
		return nil, fmt.Errorf("the share's root: %w", err)
	}
	return &node{root.(*fs.LoopbackNode)}, nil
}

// node is a loopback node that makes no device and sets no trusted
// attribute: the guest may make what a container may make in a host
// directory, less what would reach the host's devices or its kernel's
// trusted state (overlayfs's, for one).
type node struct {
	*fs.LoopbackNode
}

// WrapChild makes the loopback's new nodes nodes.
func (n *node) WrapChild(_ context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	return &node{ops.(*fs.LoopbackNode)}
}

var (
	_ fs.NodeMknoder    = (*node)(nil)
	_ fs.NodeSetxattrer = (*node)(nil)
)

// Mknod makes FIFOs, sockets and regular files only.
func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	switch mode & syscall.S_IFMT {
	case syscall.S_IFIFO, syscall.S_IFSOCK, syscall.S_IFREG, 0:
		return n.LoopbackNode.Mknod(ctx, name, mode, rdev, out)
	}
	return nil, syscall.EPERM
}

// Setxattr refuses the trusted namespace.
func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if strings.HasPrefix(attr, "trusted.") {
		return syscall.EPERM
	}
	return n.LoopbackNode.Setxattr(ctx, attr, data, flags)
}
