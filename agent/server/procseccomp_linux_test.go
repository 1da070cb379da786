package server

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	ctrdseccomp "github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// firstForkChildEnv names the shell a test child runs as its first fork.
const firstForkChildEnv = "COCOON_TEST_FIRST_FORK_CHILD"

// TestFirstForkIntoOwnPIDNamespace: the first process an agent forks (as
// in a restored pod VM, whose pause process is its first) may have a
// seccomp filter and a PID namespace of its own: it is that namespace's
// pid 1, though os's one-time pidfd check forks too.
func TestFirstForkIntoOwnPIDNamespace(t *testing.T) {
	testenv.RequireRoot(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), firstForkChildEnv+"="+testenv.LookPath(t, "sh"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("first-fork child: %v\n%s", err, out)
	}
}

// firstForkChild runs in the child, whose process has forked nothing yet.
func firstForkChild(sh string) int {
	profile, _ := json.Marshal(specs.LinuxSeccomp{DefaultAction: specs.ActAllow})
	svc := New(&fakeSystem{j: &journal{}})
	out, err := runIn(svc, &api.ExecRequest{Id: "pause", Args: []string{sh, "-c", "echo $$"}, Cwd: "/", OwnPidNamespace: true, Seccomp: profile})
	if err != nil || out != "1\n" {
		fmt.Printf("the first fork, into a PID namespace of its own under a filter: %q %v, want pid 1\n", out, err)
		return 1
	}
	return 0
}

// TestNewSeccomp: containerd's default profile, with no capability or
// with ctr's, lets the agent's fork path through; a profile refusing a
// call on it is refused naming that call; a profile that is not JSON or
// not valid is refused as invalid.
func TestNewSeccomp(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skipf("containerd's default profile is checked on x86_64 here; this is %s", runtime.GOARCH)
	}
	profile := func(p *specs.LinuxSeccomp) []byte {
		data, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	noCaps := ctrdseccomp.DefaultProfile(&specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{}}})
	ctrCaps := ctrdseccomp.DefaultProfile(&specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{
		Bounding: []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_SETUID", "CAP_SETGID", "CAP_SYS_CHROOT", "CAP_KILL"},
	}}})
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"containerd's default, no capability", profile(noCaps), ""},
		{"containerd's default, ctr's capabilities", profile(ctrCaps), ""},
		{"refuses wait4", profile(&specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{
			{Names: []string{"wait4"}, Action: specs.ActKillProcess}}}), "refuses wait4"},
		{"refuses a vfork", profile(&specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{
			{Names: []string{"clone"}, Action: specs.ActErrno, Args: []specs.LinuxSeccompArg{{Index: 0, Value: unix.CLONE_VFORK, ValueTwo: unix.CLONE_VFORK, Op: specs.OpMaskedEqual}}}}}), "refuses clone"},
		{"not JSON", []byte("{"), "seccomp profile"},
		{"unknown action", profile(&specs.LinuxSeccomp{DefaultAction: "SCMP_ACT_PERHAPS"}), "SCMP_ACT_PERHAPS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := newSeccomp(tc.data)
			if tc.want == "" {
				if err != nil || f == nil {
					t.Fatalf("newSeccomp: %v", err)
				}
				return
			}
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("newSeccomp: %v, want invalid argument naming %q", err, tc.want)
			}
		})
	}
	if f, err := newSeccomp(nil); f != nil || err != nil {
		t.Errorf("no profile: %v %v, want none", f, err)
	}
}
