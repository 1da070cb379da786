package container

import (
	"fmt"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/cinit"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/ocimount"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/server/seccomp"
)

// ownNamespaces are the namespaces a container's init may have of its own.
var ownNamespaces = map[specs.LinuxNamespaceType]uintptr{
	specs.MountNamespace: unix.CLONE_NEWNS, specs.PIDNamespace: unix.CLONE_NEWPID,
	specs.UTSNamespace: unix.CLONE_NEWUTS, specs.IPCNamespace: unix.CLONE_NEWIPC,
	specs.CgroupNamespace: unix.CLONE_NEWCGROUP,
}

// rootPropagations are the root's propagations the spec may ask for.
var rootPropagations = map[string]uintptr{
	"": 0, "slave": unix.MS_SLAVE, "rslave": unix.MS_SLAVE | unix.MS_REC,
	"private": unix.MS_PRIVATE, "rprivate": unix.MS_PRIVATE | unix.MS_REC,
}

// initPlan is a container's init as the helper takes it: its config, the
// namespaces it is cloned with, and the PID namespace it joins instead
// of a new one ("" for none).
type initPlan struct {
	cfg        cinit.Config
	cloneflags uintptr
	joinPID    string
	cgroupNS   bool
}

// planInit resolves spec for the container init: what it cannot do (a
// user or time namespace, a root shared with the guest's) is refused
// here, naming it.
func planInit(spec *specs.Spec) (*initPlan, error) {
	plan := &initPlan{cloneflags: unix.CLONE_NEWNS}
	for _, ns := range spec.Linux.Namespaces {
		flag, ok := ownNamespaces[ns.Type]
		switch {
		case !ok:
			return nil, fmt.Errorf("namespace %q: the container init makes mount, pid, uts, ipc and cgroup namespaces only: %w", ns.Type, errdefs.ErrInvalidArgument)
		case ns.Type == specs.PIDNamespace && ns.Path != "":
			plan.joinPID = ns.Path
		case ns.Path != "":
			return nil, fmt.Errorf("namespace %q at %q: expected one of the container's own: %w", ns.Type, ns.Path, errdefs.ErrInvalidArgument)
		case ns.Type == specs.CgroupNamespace:
			// The init makes it once in its cgroup: a clone's would be
			// rooted in the agent's.
			plan.cgroupNS = true
		default:
			plan.cloneflags |= flag
		}
	}
	prop, ok := rootPropagations[spec.Linux.RootfsPropagation]
	if !ok {
		return nil, fmt.Errorf("rootfsPropagation %q: expected slave or private: %w", spec.Linux.RootfsPropagation, errdefs.ErrInvalidArgument)
	}
	in := &cinit.Init{Root: spec.Root.Path, Propagation: prop, Mounts: spec.Mounts,
		MaskedPaths: spec.Linux.MaskedPaths, ReadonlyPaths: spec.Linux.ReadonlyPaths,
		ReadonlyRoot: spec.Root.Readonly, Sysctl: spec.Linux.Sysctl, CgroupNS: plan.cgroupNS}
	for _, m := range spec.Mounts {
		if err := ocimount.Check(m); err != nil {
			return nil, err
		}
	}
	if plan.cloneflags&unix.CLONE_NEWUTS != 0 {
		in.Hostname, in.Domainname = &spec.Hostname, &spec.Domainname
	}
	devices, err := initDevices(spec.Linux.Devices)
	if err != nil {
		return nil, err
	}
	in.Devices = devices
	proc, err := planProcess(spec.Process, spec.Linux.Seccomp)
	if err != nil {
		return nil, err
	}
	plan.cfg = cinit.Config{Init: in, Process: *proc}
	return plan, nil
}

// deviceTypes are the OCI device types, as mknod's mode bits.
var deviceTypes = map[string]uint32{"c": unix.S_IFCHR, "u": unix.S_IFCHR, "b": unix.S_IFBLK, "p": unix.S_IFIFO}

func initDevices(in []specs.LinuxDevice) ([]cinit.Device, error) {
	out := make([]cinit.Device, 0, len(in))
	for _, d := range in {
		t, ok := deviceTypes[d.Type]
		if !ok {
			return nil, fmt.Errorf("device %s: type %q: expected c, u, b or p: %w", d.Path, d.Type, errdefs.ErrInvalidArgument)
		}
		mode := uint32(0o666)
		if d.FileMode != nil {
			mode = uint32(d.FileMode.Perm())
		}
		cd := cinit.Device{Path: d.Path, Mode: t | mode, Major: d.Major, Minor: d.Minor}
		if d.UID != nil {
			cd.UID = *d.UID
		}
		if d.GID != nil {
			cd.GID = *d.GID
		}
		out = append(out, cd)
	}
	return out, nil
}

// planProcess resolves p: capability and rlimit names to the kernel's
// numbers, the seccomp profile to its program.
func planProcess(p *specs.Process, sc *specs.LinuxSeccomp) (*cinit.Process, error) {
	if p == nil || len(p.Args) == 0 {
		return nil, fmt.Errorf("process: expected args: %w", errdefs.ErrInvalidArgument)
	}
	out := &cinit.Process{Args: p.Args, Env: p.Env, Cwd: p.Cwd, UID: p.User.UID, GID: p.User.GID,
		Groups: p.User.AdditionalGids, Umask: p.User.Umask, NoNewPrivileges: p.NoNewPrivileges, OOMScoreAdj: p.OOMScoreAdj}
	if out.Cwd == "" {
		out.Cwd = "/"
	}
	var err error
	if out.Caps, err = capsOf(p.Capabilities); err != nil {
		return nil, err
	}
	if out.Rlimits, err = rlimitsOf(p.Rlimits); err != nil {
		return nil, err
	}
	if p.ApparmorProfile != "" || p.SelinuxLabel != "" {
		return nil, fmt.Errorf("process: the guest has no LSM for AppArmor profile %q or SELinux label %q: %w", p.ApparmorProfile, p.SelinuxLabel, errdefs.ErrInvalidArgument)
	}
	if sc != nil {
		f, err := seccomp.Compile(sc)
		if err != nil {
			return nil, fmt.Errorf("seccomp: %w", err)
		}
		prog, flags := f.Program()
		out.Seccomp = &cinit.Seccomp{Program: prog, Flags: flags}
	}
	return out, nil
}

// capsOf is c's sets by number; a name the guest's kernel lacks is an
// error.
func capsOf(c *specs.LinuxCapabilities) (*cinit.Caps, error) {
	if c == nil {
		return nil, nil
	}
	var out cinit.Caps
	for _, set := range []struct {
		names []string
		to    *[]int
	}{{c.Bounding, &out.Bounding}, {c.Effective, &out.Effective}, {c.Permitted, &out.Permitted}, {c.Inheritable, &out.Inheritable}, {c.Ambient, &out.Ambient}} {
		for _, name := range set.names {
			n, ok := cinit.Capability(name)
			if !ok {
				return nil, fmt.Errorf("capability %q: the guest's kernel does not know it: %w", name, errdefs.ErrInvalidArgument)
			}
			*set.to = append(*set.to, int(n))
		}
	}
	return &out, nil
}

func rlimitsOf(in []specs.POSIXRlimit) ([]cinit.Rlimit, error) {
	out := make([]cinit.Rlimit, 0, len(in))
	for _, l := range in {
		res, ok := cinit.RlimitResource(l.Type)
		if !ok {
			return nil, fmt.Errorf("rlimit %q: expected an OCI name such as RLIMIT_NOFILE: %w", l.Type, errdefs.ErrInvalidArgument)
		}
		out = append(out, cinit.Rlimit{Resource: res, Soft: l.Soft, Hard: l.Hard})
	}
	return out, nil
}
