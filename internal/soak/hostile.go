package soak

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Hostile is an input of the kind a hostile image, volume or caller gives:
// a restore must refuse it at create, naming it, or take it without harm.
type Hostile string

const (
	// HostileFIFOBind bind-mounts a FIFO: refused, the FIFO never opened.
	HostileFIFOBind Hostile = "fifo-bind"
	// HostileNFS asks for a mount type a VM does not mount: refused.
	HostileNFS Hostile = "nfs"
	// HostileFIFONetns names a FIFO as the network namespace: refused at
	// once, not a create that hangs.
	HostileFIFONetns Hostile = "fifo-netns"
	// HostileLinks bind-mounts a directory whose links point out of it (at
	// a secret file, ../.., a device): runs, and nothing outside reaches
	// the guest.
	HostileLinks Hostile = "links"
	// HostileEmptyDir bind-mounts an empty directory (an emptyDir at pod
	// start): runs, and the guest writes into it.
	HostileEmptyDir Hostile = "empty-dir"
)

// hostileKinds are cycled through; those needing mounts go to restores of
// the ordinary image (a snapshot image's guest takes no spec mounts).
var hostileKinds = []Hostile{HostileFIFOBind, HostileNFS, HostileFIFONetns, HostileLinks, HostileEmptyDir}

func (h Hostile) needsMounts() bool { return h != HostileFIFONetns }

// refused says the create must fail.
func (h Hostile) refused() bool {
	return h == HostileFIFOBind || h == HostileNFS || h == HostileFIFONetns
}

// Guest paths of the hostile binds, and what the guest prints of them.
const (
	linksAt   = "/mnt/links"
	emptyAt   = "/mnt/empty"
	linksOK   = "links-ok"
	emptyOK   = "empty-ok"
	nfsSource = "server:/export"
)

// hostileFixture holds the host files the hostile inputs name.
type hostileFixture struct {
	dir    string
	fifo   string
	secret string // the file the links point at; its content never reaches a guest
	links  string // a directory of links out of itself, and one file
	empty  string
}

// newHostileFixture lays the files out in a directory of its own.
func newHostileFixture() (_ *hostileFixture, err error) {
	dir, err := os.MkdirTemp("", "cocoon-soak-hostile-")
	if err != nil {
		return nil, fmt.Errorf("make hostile fixture: %w", err)
	}
	f := &hostileFixture{
		dir: dir, fifo: filepath.Join(dir, "fifo"), secret: filepath.Join(dir, "secret"),
		links: filepath.Join(dir, "vol", "links"), empty: filepath.Join(dir, "empty"),
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	if err := syscall.Mkfifo(f.fifo, 0o600); err != nil {
		return nil, fmt.Errorf("make hostile fixture: %w", err)
	}
	if err := os.WriteFile(f.secret, []byte(secretContent+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("make hostile fixture: %w", err)
	}
	for _, d := range []string{f.links, f.empty} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("make hostile fixture: %w", err)
		}
	}
	if err := os.WriteFile(filepath.Join(f.links, "ok"), []byte(linksOK+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("make hostile fixture: %w", err)
	}
	for name, target := range map[string]string{"abs": f.secret, "rel": "../../secret", "tty": "/dev/tty0"} {
		if err := os.Symlink(target, filepath.Join(f.links, name)); err != nil {
			return nil, fmt.Errorf("make hostile fixture: %w", err)
		}
	}
	return f, nil
}

// secretContent is what the secret file holds.
const secretContent = "cocoon-soak-host-secret"

func (f *hostileFixture) close() error {
	if f == nil {
		return nil
	}
	return os.RemoveAll(f.dir)
}

// specOpt is the input h puts in a restore's spec.
func (f *hostileFixture) specOpt(h Hostile) oci.SpecOpts {
	switch h {
	case HostileFIFOBind:
		return withMount(specs.Mount{Destination: "/mnt/fifo", Type: "bind", Source: f.fifo, Options: []string{"rbind", "ro"}})
	case HostileNFS:
		return withMount(specs.Mount{Destination: "/mnt/nfs", Type: "nfs", Source: nfsSource})
	case HostileFIFONetns:
		return oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: f.fifo})
	case HostileLinks:
		return withMount(specs.Mount{Destination: linksAt, Type: "bind", Source: f.links, Options: []string{"rbind", "ro"}})
	case HostileEmptyDir:
		return withMount(specs.Mount{Destination: emptyAt, Type: "bind", Source: f.empty, Options: []string{"rbind", "rw"}})
	}
	return func(context.Context, oci.Client, *containers.Container, *oci.Spec) error { return nil }
}

func withMount(m specs.Mount) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Mounts = append(s.Mounts, m)
		return nil
	}
}

// script is what init runs to show h was taken without harm: the links'
// targets read (they must not show the secret), a file written in the
// empty directory.
func (h Hostile) script() []string {
	switch h {
	case HostileLinks:
		return []string{fmt.Sprintf("cat %[1]s/abs %[1]s/rel %[1]s/tty %[1]s/ok 2>&1", linksAt)}
	case HostileEmptyDir:
		return []string{fmt.Sprintf("touch %[1]s/written && ls %[1]s | grep -qx written && echo %s", emptyAt, emptyOK)}
	}
	return nil
}

// printed is the line init prints when h was taken as it should be.
func (h Hostile) printed() string {
	switch h {
	case HostileLinks:
		return linksOK
	case HostileEmptyDir:
		return emptyOK
	}
	return ""
}

// checkRefusal checks a refused create's error: it must name the input,
// and not be containerd's task API v2 fallback (an Unimplemented answer
// from Create, whose error lost the reason and whose shim stayed).
func (f *hostileFixture) checkRefusal(h Hostile, err error) error {
	if err == nil {
		return fmt.Errorf("hostile %s: the create succeeded, want it refused", h)
	}
	want := map[Hostile]string{HostileFIFOBind: f.fifo, HostileNFS: `"nfs"`, HostileFIFONetns: f.fifo}[h]
	if msg := err.Error(); !strings.Contains(msg, want) || strings.Contains(msg, "task.v2") {
		return fmt.Errorf("hostile %s: refused with %q, want an error naming %s", h, msg, want)
	}
	return nil
}

// checkLeak fails when the secret reached the guest's output.
func checkLeak(stdout, stderr string) error {
	if strings.Contains(stdout, secretContent) || strings.Contains(stderr, secretContent) {
		return errors.New("a host file outside the bind reached the guest through a link")
	}
	return nil
}
