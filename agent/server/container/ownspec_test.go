package container

import (
	"io/fs"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/moby/sys/capability"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// TestPlanInit: the spec resolved for the container init, and what it
// refuses, naming it.
func TestPlanInit(t *testing.T) {
	ns := func(types ...specs.LinuxNamespaceType) []specs.LinuxNamespace {
		var out []specs.LinuxNamespace
		for _, typ := range types {
			out = append(out, specs.LinuxNamespace{Type: typ})
		}
		return out
	}
	base := func(edit func(*specs.Spec)) *specs.Spec {
		s := &specs.Spec{
			Process:  &specs.Process{Args: []string{"sh"}, User: specs.User{UID: 1000, GID: 1000, AdditionalGids: []uint32{5}}},
			Root:     &specs.Root{Path: "/run/c/root", Readonly: true},
			Hostname: "web",
			Linux:    &specs.Linux{Namespaces: ns(specs.PIDNamespace, specs.MountNamespace, specs.UTSNamespace, specs.IPCNamespace, specs.CgroupNamespace)},
		}
		if edit != nil {
			edit(s)
		}
		return s
	}
	for _, tc := range []struct {
		name    string
		spec    *specs.Spec
		check   func(*testing.T, *initPlan)
		wantErr func(error) bool
		errHas  string
	}{
		{name: "namespaces", spec: base(nil), check: func(t *testing.T, p *initPlan) {
			if want := uintptr(unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC); p.cloneflags != want || !p.cfg.Init.CgroupNS {
				t.Errorf("cloneflags %#x, cgroup namespace %v; want %#x, made by the init", p.cloneflags, p.cfg.Init.CgroupNS, want)
			}
			if in := p.cfg.Init; in.Hostname == nil || *in.Hostname != "web" || !in.ReadonlyRoot || in.Root != "/run/c/root" || p.cfg.Process.Cwd != "/" {
				t.Errorf("init %+v, cwd %q", in, p.cfg.Process.Cwd)
			}
		}},
		{name: "pod-pid", spec: base(func(s *specs.Spec) {
			s.Linux.Namespaces = []specs.LinuxNamespace{{Type: specs.PIDNamespace, Path: "/proc/7/ns/pid"}, {Type: specs.MountNamespace}}
		}), check: func(t *testing.T, p *initPlan) {
			if p.joinPID != "/proc/7/ns/pid" || p.cloneflags != unix.CLONE_NEWNS || p.cfg.Init.Hostname != nil {
				t.Errorf("join %q, cloneflags %#x, hostname %v: want the pod's PID namespace joined, the VM's UTS kept", p.joinPID, p.cloneflags, p.cfg.Init.Hostname)
			}
		}},
		{name: "caps-rlimits-devices", spec: base(func(s *specs.Spec) {
			s.Process.Capabilities = &specs.LinuxCapabilities{Bounding: []string{"CAP_NET_BIND_SERVICE", "CAP_CHOWN"}, Ambient: []string{"CAP_NET_BIND_SERVICE"}}
			s.Process.Rlimits = []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Soft: 10, Hard: 20}}
			mode := fs.FileMode(0o600)
			s.Linux.Devices = []specs.LinuxDevice{{Path: "/dev/fuse", Type: "c", Major: 10, Minor: 229, FileMode: &mode}}
		}), check: func(t *testing.T, p *initPlan) {
			c := p.cfg.Process.Caps
			if !slices.Equal(c.Bounding, []int{int(capability.CAP_NET_BIND_SERVICE), int(capability.CAP_CHOWN)}) || !slices.Equal(c.Ambient, []int{int(capability.CAP_NET_BIND_SERVICE)}) {
				t.Errorf("caps %+v", c)
			}
			if l := p.cfg.Process.Rlimits; len(l) != 1 || l[0].Resource != unix.RLIMIT_NOFILE || l[0].Soft != 10 || l[0].Hard != 20 {
				t.Errorf("rlimits %+v", l)
			}
			if d := p.cfg.Init.Devices; len(d) != 1 || d[0].Mode != unix.S_IFCHR|0o600 || d[0].Major != 10 || d[0].Minor != 229 {
				t.Errorf("devices %+v", d)
			}
		}},
		{name: "user-namespace", spec: base(func(s *specs.Spec) {
			s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UserNamespace})
		}),
			wantErr: errdefs.IsInvalidArgument, errHas: `namespace "user"`},
		{name: "uts-path", spec: base(func(s *specs.Spec) {
			s.Linux.Namespaces = []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.UTSNamespace, Path: "/proc/9/ns/uts"}}
		}), wantErr: errdefs.IsInvalidArgument, errHas: "/proc/9/ns/uts"},
		{name: "shared-root", spec: base(func(s *specs.Spec) { s.Linux.RootfsPropagation = "rshared" }), wantErr: errdefs.IsInvalidArgument, errHas: `"rshared"`},
		{name: "unknown-cap", spec: base(func(s *specs.Spec) { s.Process.Capabilities = &specs.LinuxCapabilities{Bounding: []string{"CAP_NOPE"}} }),
			wantErr: errdefs.IsInvalidArgument, errHas: "CAP_NOPE"},
		{name: "unknown-rlimit", spec: base(func(s *specs.Spec) { s.Process.Rlimits = []specs.POSIXRlimit{{Type: "RLIMIT_NOPE"}} }),
			wantErr: errdefs.IsInvalidArgument, errHas: "RLIMIT_NOPE"},
		{name: "device-type", spec: base(func(s *specs.Spec) { s.Linux.Devices = []specs.LinuxDevice{{Path: "/dev/x", Type: "z"}} }),
			wantErr: errdefs.IsInvalidArgument, errHas: `type "z"`},
		{name: "mount-type", spec: base(func(s *specs.Spec) { s.Mounts = []specs.Mount{{Destination: "/x", Type: "nfs", Source: "h:/x"}} }),
			wantErr: errdefs.IsInvalidArgument, errHas: "nfs"},
		{name: "apparmor", spec: base(func(s *specs.Spec) { s.Process.ApparmorProfile = "custom" }), wantErr: errdefs.IsInvalidArgument, errHas: "custom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := planInit(tc.spec)
			if tc.wantErr != nil {
				if err == nil || !tc.wantErr(err) || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("error %v, want one naming %q of the right class", err, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, p)
		})
	}
}
