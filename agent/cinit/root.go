package cinit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	securejoin "github.com/cyphar/filepath-securejoin"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/ocimount"
)

// make builds the container's root in the new mount namespace, as runc
// does: its cgroup namespace (this thread's, which the exec takes), the root a mount of its own, the spec's mounts and devices in it,
// the cwd made, then pivoted into, then sysctls, the masked and read-only
// paths and the read-only root, and the hostname.
func (in *Init) make(cwd string) error {
	if in.CgroupNS {
		if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
			return fmt.Errorf("make cgroup namespace: %w", err)
		}
	}
	prop := in.Propagation
	if prop == 0 {
		prop = unix.MS_SLAVE | unix.MS_REC
	}
	if err := unix.Mount("", "/", "", prop, ""); err != nil {
		return fmt.Errorf("set the root's propagation: %w", err)
	}
	if err := unix.Mount(in.Root, in.Root, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind the root: %w", err)
	}
	// Nothing is undone on failure: the namespace ends with the init.
	s := ocimount.NewStack(ocimount.System{})
	for _, m := range in.Mounts {
		if err := s.Container(in.Root, m); err != nil {
			return err
		}
	}
	if err := in.makeDevices(); err != nil {
		return err
	}
	if err := makeCwd(in.Root, cwd); err != nil {
		return err
	}
	if err := pivot(in.Root); err != nil {
		return err
	}
	if err := setSysctls(in.Sysctl); err != nil {
		return err
	}
	if err := s.Confine("/", in.MaskedPaths, in.ReadonlyPaths, in.ReadonlyRoot); err != nil {
		return err
	}
	return in.setNames()
}

// makeDevices makes the spec's device nodes, as runc does: /dev/ptmx is
// the devpts's (a link made with /dev), and a path where something is
// already stays as it is. The terminal is bound at /dev/console.
func (in *Init) makeDevices() error {
	for _, d := range in.Devices {
		if filepath.Clean(d.Path) == "/dev/ptmx" {
			continue
		}
		p, err := securejoin.SecureJoin(in.Root, d.Path)
		if err != nil {
			return fmt.Errorf("device %s: %w", d.Path, err)
		}
		if err := makeDevice(p, d); err != nil {
			return fmt.Errorf("device %s: %w", d.Path, err)
		}
	}
	if in.Console == "" {
		return nil
	}
	p, err := securejoin.SecureJoin(in.Root, "/dev/console")
	if err == nil {
		err = ocimount.MakeMountPoint(p, false)
	}
	if err == nil {
		err = unix.Mount(in.Console, p, "", unix.MS_BIND, "")
	}
	if err != nil {
		return fmt.Errorf("bind the console: %w", err)
	}
	return nil
}

func makeDevice(p string, d Device) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	err := ocimount.System{}.Mknod(p, d.Mode, unix.Mkdev(uint32(d.Major), uint32(d.Minor)))
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("mknod: %w", err)
	}
	return os.Lchown(p, int(d.UID), int(d.GID))
}

// makeCwd makes the process's working directory, as runc does, when the
// image lacks it.
func makeCwd(root, cwd string) error {
	p, err := securejoin.SecureJoin(root, cwd)
	if err == nil {
		err = os.MkdirAll(p, 0o755)
	}
	if err != nil {
		return fmt.Errorf("make cwd %s: %w", cwd, err)
	}
	return nil
}

// pivot makes root the namespace's root and detaches the old one, so no
// path leads out of the container.
func pivot(root string) error {
	if err := unix.Chdir(root); err != nil {
		return fmt.Errorf("enter the root: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	// The old root is stacked on the new one: keep its unmount from
	// reaching the agent's namespace, then drop it.
	if err := unix.Mount("", ".", "", unix.MS_SLAVE|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make the old root a slave: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("enter the new root: %w", err)
	}
	return nil
}

// setSysctls writes the container's sysctls, in its namespaces.
func setSysctls(sysctl map[string]string) error {
	for k, v := range sysctl {
		if strings.Contains(k, "/") || strings.Contains(k, "..") {
			return fmt.Errorf("sysctl %q: expected a dotted name", k)
		}
		p := filepath.Join("/proc/sys", strings.ReplaceAll(k, ".", "/"))
		if err := os.WriteFile(p, []byte(v), 0); err != nil {
			return fmt.Errorf("set sysctl %s: %w", k, err)
		}
	}
	return nil
}

func (in *Init) setNames() error {
	if in.Hostname != nil {
		if err := unix.Sethostname([]byte(*in.Hostname)); err != nil {
			return fmt.Errorf("set hostname: %w", err)
		}
	}
	if in.Domainname != nil {
		if err := unix.Setdomainname([]byte(*in.Domainname)); err != nil {
			return fmt.Errorf("set domainname: %w", err)
		}
	}
	return nil
}
